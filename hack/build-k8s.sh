#!/usr/bin/env bash
# Build (once) and cache the binaries of the local cluster, from the Go module proxy only:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl  (k8s.io/kubernetes)
#   kube-proxy (real nodes' Services: hack/localkube/realnode.py)              (k8s.io/kubernetes)
#   etcd                                                                       (go.etcd.io/etcd/server/v3)
#   helm                                                                       (helm.sh/helm/v3)
#   kwok       (the hollow nodes: Node and Pod lifecycles from Stages)         (sigs.k8s.io/kwok)
#   krew       (installs the kubectl plugin from deploy/krew/holmes.yaml)      (sigs.k8s.io/krew)
# `hack/build-k8s.sh clients` builds kubectl, helm and krew only (make unit); `hack/build-k8s.sh
# node` the Kubernetes commands with kube-proxy, which only real nodes run (make node).
# The cache lives outside the repository so a fresh clone reuses it:
#   ${HOLMES_CACHE:-$HOME/.cache/holmes}/bin     the binaries (bin/.versions says which)
#   ${HOLMES_CACHE:-$HOME/.cache/holmes}/go/mod  the Go module cache (kept: a rebuild is offline)
# A binary is rebuilt when it is missing or bin/.versions names another release for it.
#
# Why a module of our own: k8s.io/kubernetes requires its ~33 staging modules (k8s.io/api,
# k8s.io/client-go, ...) at v0.0.0 and replaces them with ./staging/src/...; Go ignores a
# dependency's replace directives, so `go install k8s.io/kubernetes/cmd/...@v1.37.2` fails. A
# module that requires k8s.io/kubernetes and replaces each staging module with its published
# v0.<minor>.<patch> builds every command (etcd's server module is built the same way).
set -euo pipefail

CACHE="${HOLMES_CACHE:-$HOME/.cache/holmes}"
BIN="$CACHE/bin"
# this run's scratch (module dirs, outputs): its own, so that two builds sharing the cache (two
# checkouts) never remove each other's; removed when the script exits. Go's build cache is not in
# it: $CACHE/go/build is kept and shared (hack/lib.sh go_env)
WORK="$CACHE/work.$$"
DEFAULT_K8S_VERSION=v1.37.2   # the release the tests run on (docs/install.md)
K8S_VERSION="${HOLMES_K8S_VERSION:-$DEFAULT_K8S_VERSION}"
ETCD_VERSION="v3.6.16"
HELM_VERSION="v3.22.0"
KREW_VERSION="v0.4.3"   # tests/unit/packaging/test_krew.py installs the plugin with it
KWOK_VERSION="v0.8.0"   # hack/localkube/hollow.py runs it with the Stages of hack/localkube/kwok-stages.yaml
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
# what only real nodes run besides the kubelet (`build-k8s.sh node`, which `make node` runs): not
# built for `make test`, whose nodes are the node agent's
NODE_CMDS=(kube-proxy)
RELEASE_ONLY=""
if [[ "$K8S_VERSION" != "$DEFAULT_K8S_VERSION" ]]; then
  # another release (the compatibility tier, `make compat`): its control plane and kubectl in a
  # directory of their own, beside the default's; etcd, helm, kwok, krew and the nodes' pieces
  # stay the default's
  BIN="$CACHE/releases/$K8S_VERSION"
  K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
  RELEASE_ONLY=1
fi
GO_MIN_MINOR=26   # k8s.io/kubernetes v1.37's go.mod says `go 1.26.0`

LIB_TAG=build-k8s
# say, die, apt_get, run_with_progress, have_bin, record, go_tool, go_env, go_build_cache_mb
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

mkdir -p "$BIN" "$WORK"
trap 'rm -rf "$WORK"' EXIT
VERSIONS="$BIN/.versions"   # lines "<binary> <version>" (hack/lib.sh have_bin, record)

ensure_tools() {  # host tools the steps below (and the node agent) need
  local missing=()
  command -v unshare >/dev/null || missing+=(util-linux) # node agent's per-pod mount/uts namespaces
  command -v ip      >/dev/null || missing+=(iproute2)   # node agent: `ip netns` per pod
  local cni=/usr/lib/cni                                 # the pods' CNI plugins (hack/localkube/podnet.py)
  [[ -x $cni/bridge && -x $cni/host-local && -x $cni/loopback ]] || missing+=(containernetworking-plugins)
  command -v openssl >/dev/null || missing+=(openssl)    # service-account key
  command -v g++     >/dev/null || missing+=(g++)        # the dry run's fake CUDA device (holmes.trainer.dryrun.fakecuda)
  if ((${#missing[@]})); then
    say "installing host tools: ${missing[*]}"
    apt_get install -y -qq "${missing[@]}" >/dev/null || die "could not apt-get install ${missing[*]}"
  fi
}

build_with_progress() {  # build_with_progress WHAT LOG CMD...
  local what=$1 log=$2 start=$SECONDS; shift 2
  run_with_progress "$what" "$log" 30 go_build_cache_mb "$@"
  say "  $what: done in $((SECONDS - start))s"
}

build_kube() {  # build_kube CMD... (the ones missing)
  local go; go=$(go_tool); go_env
  local mod="$WORK/k8s-mod" staging="${K8S_VERSION/#v1./v0.}"
  rm -rf "$mod" && mkdir -p "$mod"
  say "kubernetes $K8S_VERSION: resolving k8s.io/kubernetes and its staging modules at $staging"
  local gomod
  gomod=$(cd "$mod" && "$go" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -nE 's/^\s*"GoMod": "(.*)",?$/\1/p') \
    || die "go mod download k8s.io/kubernetes@$K8S_VERSION failed (is the Go module proxy reachable?)"
  [[ -f "$gomod" ]] || die "no go.mod for k8s.io/kubernetes@$K8S_VERSION in the module cache"
  {
    echo "module holmes.local/k8s-build"
    echo
    sed -nE 's/^go ([0-9.]+)$/go \1/p' "$gomod"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # every `k8s.io/x => ./staging/src/k8s.io/x` of kubernetes' go.mod, pointed at the published one
    sed -nE "s#^\s*(k8s\.io/[a-z0-9-]+) => \./staging/src/.*#replace \1 => \1 $staging#p" "$gomod"
  } > "$mod/go.mod"
  local n; n=$(grep -c '^replace' "$mod/go.mod")
  ((n > 20)) || die "found only $n staging modules in $gomod: has kubernetes' go.mod changed form?"
  local pkgs=() c
  for c in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  # at the release asked for: a bare `go get PKG` would upgrade k8s.io/kubernetes to the newest
  (cd "$mod" && "$go" get "${pkgs[@]/%/@$K8S_VERSION}" >"$WORK/go-get.log" 2>&1) \
    || { tail -20 "$WORK/go-get.log" >&2; die "resolving the kubernetes modules failed; log: $WORK/go-get.log"; }
  local minor; minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  local ldflags="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  say "compiling ${*} $K8S_VERSION with $("$go" version | cut -d' ' -f3) (from a cold build cache about 7 min on 2 idle cores, 33 at load 14; what $GOCACHE has is reused)"
  mkdir -p "$WORK/out"
  build_with_progress "kubernetes" "$CACHE/build-k8s.log" \
    bash -c 'cd "$1" && shift && go build -ldflags "$1" -o "$2/" "${@:3}"' _ "$mod" "$ldflags" "$WORK/out" "${pkgs[@]}"
  for c in "$@"; do
    [[ -x "$WORK/out/$c" ]] || die "the build finished but $c is missing; log: $CACHE/build-k8s.log"
    install -m 0755 "$WORK/out/$c" "$BIN/$c" && record "$c" "$K8S_VERSION"
  done
}

build_etcd() {
  have_bin etcd "$ETCD_VERSION" && return
  local go; go=$(go_tool); go_env
  local mod="$WORK/etcd-mod"
  rm -rf "$mod" && mkdir -p "$mod"
  say "etcd $ETCD_VERSION: go.etcd.io/etcd/server/v3"
  printf 'module holmes.local/etcd-build\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$mod/go.mod"
  (cd "$mod" && "$go" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >"$WORK/go-get.log" 2>&1) \
    || { tail -20 "$WORK/go-get.log" >&2; die "resolving go.etcd.io/etcd/server/v3@$ETCD_VERSION failed"; }
  build_with_progress "etcd" "$CACHE/build-etcd.log" \
    bash -c 'cd "$1" && go build -ldflags "-s -w" -o "$2/etcd" go.etcd.io/etcd/server/v3' _ "$mod" "$WORK/out"
  install -m 0755 "$WORK/out/etcd" "$BIN/etcd" && record etcd "$ETCD_VERSION"
}

build_helm() {  # helm from its module; its offline default Kubernetes version is the one built here
  have_bin helm "$HELM_VERSION" && return
  local go; go=$(go_tool); go_env
  local mod="$WORK/helm-mod" minor; minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  rm -rf "$mod" && mkdir -p "$mod"
  say "helm $HELM_VERSION: helm.sh/helm/v3"
  printf 'module holmes.local/helm-build\n\ngo 1.24\n\nrequire helm.sh/helm/v3 %s\n' "$HELM_VERSION" > "$mod/go.mod"
  (cd "$mod" && "$go" get "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >"$WORK/go-get.log" 2>&1) \
    || { tail -20 "$WORK/go-get.log" >&2; die "resolving helm.sh/helm/v3@$HELM_VERSION failed"; }
  local ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" p
  for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$minor"
  done
  build_with_progress "helm" "$CACHE/build-helm.log" \
    bash -c 'cd "$1" && go build -ldflags "$2" -o "$3/helm" helm.sh/helm/v3/cmd/helm' _ "$mod" "$ldflags" "$WORK/out"
  install -m 0755 "$WORK/out/helm" "$BIN/helm" && record helm "$HELM_VERSION"
}

build_kwok() {  # kwok's controller (cmd/kwok, not kwokctl): the hollow nodes' kubelet stand-in
  have_bin kwok "$KWOK_VERSION" && return
  local go; go=$(go_tool); go_env
  local mod="$WORK/kwok-mod"
  rm -rf "$mod" && mkdir -p "$mod"
  say "kwok $KWOK_VERSION: sigs.k8s.io/kwok/cmd/kwok"
  printf 'module holmes.local/kwok-build\n\ngo 1.26\n\nrequire sigs.k8s.io/kwok %s\n' "$KWOK_VERSION" > "$mod/go.mod"
  (cd "$mod" && "$go" get "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >"$WORK/go-get.log" 2>&1) \
    || { tail -20 "$WORK/go-get.log" >&2; die "resolving sigs.k8s.io/kwok@$KWOK_VERSION failed"; }
  build_with_progress "kwok" "$CACHE/build-kwok.log" \
    bash -c 'cd "$1" && go build -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$2" -o "$3/kwok" sigs.k8s.io/kwok/cmd/kwok' \
    _ "$mod" "$KWOK_VERSION" "$WORK/out"
  install -m 0755 "$WORK/out/kwok" "$BIN/kwok" && record kwok "$KWOK_VERSION"
}

build_krew() {  # krew's go.mod has no replace directives: `go install` builds it as it is
  have_bin krew "$KREW_VERSION" && return
  local go; go=$(go_tool); go_env
  say "krew $KREW_VERSION: sigs.k8s.io/krew/cmd/krew"
  build_with_progress "krew" "$CACHE/build-krew.log" \
    env GOBIN="$WORK/out" "$go" install -trimpath -ldflags "-s -w" "sigs.k8s.io/krew/cmd/krew@$KREW_VERSION"
  install -m 0755 "$WORK/out/krew" "$BIN/krew" && record krew "$KREW_VERSION"
}

missing_kube() {  # the Kubernetes commands (of those named) not built at K8S_VERSION
  local c
  for c in "$@"; do have_bin "$c" "$K8S_VERSION" || echo "$c"; done
}

finish() {  # the module dirs and outputs are only needed while building
  rm -rf "$WORK"
  say "binaries ready in $BIN: $(tr '\n' ' ' < "$VERSIONS")"
}

# `build-k8s.sh clients` (make unit): kubectl, helm and krew, which the unit tier's chart,
# kustomize and plugin checks run; no control plane.
clients() {
  local need; need=$(missing_kube kubectl)
  [[ -z "$need" ]] || build_kube kubectl
  build_helm
  build_krew
  finish
}

main() {
  if [[ "${1:-}" == clients ]]; then clients; return; fi
  if [[ "${1:-}" == node ]]; then
    local need; need=$(missing_kube "${K8S_CMDS[@]}" "${NODE_CMDS[@]}")
    # shellcheck disable=SC2086
    [[ -z "$need" ]] || build_kube $need
    finish; return
  fi
  [[ -z "${1:-}" ]] || die "unknown argument $1: none builds everything, \`clients\` kubectl, helm and krew only, \`node\` the kubelet and kube-proxy too"
  ensure_tools
  local need; need=$(missing_kube "${K8S_CMDS[@]}")
  # shellcheck disable=SC2086
  [[ -z "$need" ]] || build_kube $need
  [[ -z "$RELEASE_ONLY" ]] || { finish; return; }
  build_etcd
  build_helm
  build_krew
  build_kwok
  finish
}

main "$@"
