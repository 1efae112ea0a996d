#!/usr/bin/env bash
# Build (once) and cache the real Kueue for the test bed (make kueue-up), from the Go module proxy
# only, like hack/build-k8s.sh builds the control plane:
#   bin/kueue                    sigs.k8s.io/kueue's cmd/kueue (the manager), from its module
#   kueue/<version>/manifests.yaml  `kubectl kustomize` of the module's own config/default
#                                (CRDs, RBAC, webhooks, the manager's config map, its Deployment)
# in ${HOLMES_CACHE:-$HOME/.cache/holmes} (bin/.versions says which release each is; the Go
# module cache go/mod is kept, so a rebuild is offline). Rebuilt when missing or another release.
# The manager is run as a host process by hack/localkube/kueue.py, not as the Deployment.
set -euo pipefail

CACHE="${HOLMES_CACHE:-$HOME/.cache/holmes}"
BIN="$CACHE/bin"
WORK="$CACHE/work-kueue"
KUEUE_VERSION="${HOLMES_KUEUE_VERSION:-v0.17.1}"   # the newest release the module proxy serves
GO_MIN_MINOR=25   # sigs.k8s.io/kueue v0.17's go.mod says `go 1.25.0`
MANIFESTS="$CACHE/kueue/$KUEUE_VERSION/manifests.yaml"

LIB_TAG=build-kueue
# say, die, run_with_progress, have, have_bin, record, go_tool, go_env, go_build_cache_mb, render_kustomize
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ "$KUEUE_VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] \
  || die "HOLMES_KUEUE_VERSION=$KUEUE_VERSION: give a release as vMAJOR.MINOR.PATCH (e.g. v0.17.1)"

mkdir -p "$BIN"
# One build at a time per cache (test runs of several checkouts share it): the others wait.
exec 9>"$CACHE/.build-kueue.lock"
command -v flock >/dev/null && flock 9
module_dir() {  # the module's (read-only) directory in the module cache, downloading it if needed
  local go=$1 dir
  dir=$(cd "$WORK" && "$go" mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -nE 's/^\s*"Dir": "(.*)",?$/\1/p') \
    || die "go mod download sigs.k8s.io/kueue@$KUEUE_VERSION failed (is the Go module proxy reachable?)"
  [[ -d "$dir/cmd/kueue" && -d "$dir/config/default" ]] \
    || die "sigs.k8s.io/kueue@$KUEUE_VERSION in $dir has no cmd/kueue or config/default: has the module changed form?"
  echo "$dir"
}

build_manager() {
  local go=$1 mod="$WORK/mod"
  rm -rf "$mod" && mkdir -p "$mod"
  # A module of our own requiring Kueue: its go.mod has no replace directives, so minimal version
  # selection picks exactly the dependency versions Kueue's release was built with.
  printf 'module holmes.local/kueue-build\n\ngo 1.25.0\n\nrequire sigs.k8s.io/kueue %s\n' "$KUEUE_VERSION" > "$mod/go.mod"
  (cd "$mod" && nice "$go" get "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" >"$WORK/go-get.log" 2>&1) \
    || { tail -20 "$WORK/go-get.log" >&2; die "resolving sigs.k8s.io/kueue@$KUEUE_VERSION failed; log: $WORK/go-get.log"; }
  local ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
  say "compiling kueue $KUEUE_VERSION with $("$go" version | cut -d' ' -f3) (about 5 min on 2 cores from a cold cache)"
  local start=$SECONDS
  run_with_progress "kueue" "$CACHE/build-kueue.log" 30 go_build_cache_mb \
    bash -c 'cd "$1" && nice go build -ldflags "$2" -o "$3/kueue" sigs.k8s.io/kueue/cmd/kueue' _ "$mod" "$ldflags" "$WORK"
  say "  kueue: done in $((SECONDS - start))s"
  install -m 0755 "$WORK/kueue" "$BIN/kueue" && record kueue "$KUEUE_VERSION"
}

render_manifests() {  # kubectl kustomize of the module's config/default
  render_kustomize "Kueue $KUEUE_VERSION" "$1" config/default "$MANIFESTS"
  record kueue-manifests "$KUEUE_VERSION"
}

main() {
  [[ -z "${1:-}" ]] || die "unknown argument $1: build-kueue.sh takes none (HOLMES_KUEUE_VERSION picks the release)"
  local need_bin=1 need_manifests=1
  have_bin kueue "$KUEUE_VERSION" && need_bin=0
  [[ -f "$MANIFESTS" ]] && have kueue-manifests "$KUEUE_VERSION" && need_manifests=0
  if ((need_bin || need_manifests)); then
    local go; go=$(go_tool); go_env
    mkdir -p "$WORK"
    say "kueue $KUEUE_VERSION: sigs.k8s.io/kueue"
    local dir; dir=$(module_dir "$go")
    ((need_manifests)) && render_manifests "$dir"
    ((need_bin)) && build_manager "$go"
    rm -rf "$WORK"
  fi
  say "kueue $KUEUE_VERSION ready: $BIN/kueue, $MANIFESTS"
}

main "$@"
