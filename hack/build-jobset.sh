#!/usr/bin/env bash
# Build (once) and cache the real JobSet controller for the test bed (make jobset-up), from the
# Go module proxy only, as hack/build-kueue.sh builds Kueue:
#   bin/jobset                       sigs.k8s.io/jobset's manager (its main package is the module root)
#   jobset/<version>/manifests.yaml  `kubectl kustomize` of the module's own config/default
#                                    (CRD, RBAC, webhooks, the manager's config map, its Deployment)
# in ${HOLMES_CACHE:-$HOME/.cache/holmes} (bin/.versions says which release each is; the Go module
# cache go/mod is kept, so a rebuild is offline). Rebuilt when missing or another release.
# The manager is run as a host process by hack/localkube/jobset.py, not as the Deployment.
set -euo pipefail

CACHE="${HOLMES_CACHE:-$HOME/.cache/holmes}"
BIN="$CACHE/bin"
WORK="$CACHE/work-jobset"
MODULE=sigs.k8s.io/jobset
JOBSET_VERSION="${HOLMES_JOBSET_VERSION:-v0.12.0}"   # the newest release the module proxy serves
GO_MIN_MINOR=26   # sigs.k8s.io/jobset v0.12's go.mod says `go 1.26.0`
MANIFESTS="$CACHE/jobset/$JOBSET_VERSION/manifests.yaml"

LIB_TAG=build-jobset
# say, die, have, have_bin, record, module_dir, go_module_build, render_kustomize
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ "$JOBSET_VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] \
  || die "HOLMES_JOBSET_VERSION=$JOBSET_VERSION: give a release as vMAJOR.MINOR.PATCH (e.g. v0.12.0)"

render_manifests() {  # kubectl kustomize of the module's config/default
  render_kustomize "JobSet $JOBSET_VERSION" "$1" config/default "$MANIFESTS"
  record jobset-manifests "$JOBSET_VERSION"
}

main() {
  [[ -z "${1:-}" ]] || die "unknown argument $1: build-jobset.sh takes none (HOLMES_JOBSET_VERSION picks the release)"
  mkdir -p "$BIN"
  # One build at a time per cache (test runs of several checkouts share it): the others wait.
  exec 9>"$CACHE/.build-jobset.lock"
  command -v flock >/dev/null && flock 9
  local need_bin=1 need_manifests=1
  have_bin jobset "$JOBSET_VERSION" && need_bin=0
  [[ -f "$MANIFESTS" ]] && have jobset-manifests "$JOBSET_VERSION" && need_manifests=0
  if ((need_bin || need_manifests)); then
    rm -rf "$WORK" && mkdir -p "$WORK"
    ((need_manifests)) && render_manifests "$(module_dir "$MODULE" "$JOBSET_VERSION")"
    if ((need_bin)); then
      say "compiling jobset $JOBSET_VERSION (about 2.5 min on 2 cores from a cold build cache)"
      go_module_build jobset "$MODULE" "$JOBSET_VERSION" \
        "-s -w -X $MODULE/pkg/version.GitVersion=$JOBSET_VERSION" "" "$MODULE"
      install -m 0755 "$WORK/out/jobset" "$BIN/jobset" && record jobset "$JOBSET_VERSION"
    fi
    rm -rf "$WORK"
  fi
  say "jobset $JOBSET_VERSION ready: $BIN/jobset, $MANIFESTS"
}

main "$@"
