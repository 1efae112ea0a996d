#!/usr/bin/env bash
# Build (once) and cache what a real node of the local cluster runs beside the kubelet
# (hack/build-k8s.sh builds the kubelet), from the Go module proxy only:
#   bin/containerd, bin/containerd-shim-runc-v2, bin/ctr   github.com/containerd/containerd/v2
#   cni/bin/bridge, host-local, loopback, portmap          github.com/containernetworking/plugins
#   cni/bin/multus  (the thin plugin)                      gopkg.in/k8snetworkplumbingwg/multus-cni.v4
#   node/nad-crd.yaml  the NetworkAttachmentDefinition CRD, from that module's deployments/
#   bin/coredns     hack/coredns: a module of ours, CoreDNS's coremain with the plugins a
#                   cluster's DNS uses (github.com/coredns/coredns's own main links all 54)
#   node/pause.tar  the pods' sandbox image (an OCI image archive of a static program of ours that
#                   waits for SIGTERM), imported into each node's containerd: no registry here
#   bin/dra-plugin  the testbed's DRA kubelet plugin (hack/dra-plugin: a module of ours on
#                   k8s.io/dynamic-resource-allocation's kubelet-plugin helper), one per real node
# runc comes from Debian. Everything lives in ${HOLMES_CACHE:-$HOME/.cache/holmes} (bin/.versions
# says which release each piece is, for our modules a hash of their sources; another is rebuilt;
# the Go module cache go/mod is kept, so a rebuild is offline, and so is Go's build cache go/build,
# shared with hack/build-k8s.sh). hack/localkube/realnode.py runs them. From a cold build cache
# after `make k8s`: 559 s on the 2 shared cores at load 3-12 (docs/local-cluster.md#real-nodes).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${HOLMES_CACHE:-$HOME/.cache/holmes}"
BIN="$CACHE/bin"
CNI_BIN="$CACHE/cni/bin"
NODE="$CACHE/node"
WORK="$CACHE/work-node.$$"
CONTAINERD_VERSION="v2.4.2"
CNI_VERSION="v1.10.0"
MULTUS_VERSION="v4.2.3"
PAUSE_VERSION="1"   # our own program: bump when hack/localkube/pause.go changes
PAUSE_REF="localhost/holmes-pause:$PAUSE_VERSION"   # hack/localkube/realnode.py names it too
GO_MIN_MINOR=26   # containerd v2.4.2 and the CNI plugins v1.10.0 say `go 1.26.x`

LIB_TAG=build-node
# say, die, apt_get, run_with_progress, the Go and .versions helpers
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

mkdir -p "$BIN" "$CNI_BIN" "$NODE" "$WORK"
trap 'rm -rf "$WORK"' EXIT
# One build at a time per cache (test runs of several checkouts share it): the others wait.
exec 9>"$CACHE/.build-node.lock"
command -v flock >/dev/null && flock 9

ensure_tools() {
  local missing=()
  command -v runc >/dev/null || missing+=(runc)       # containerd's runc shim runs it
  command -v ip   >/dev/null || missing+=(iproute2)   # the nodes' bridges
  if ((${#missing[@]})); then
    say "installing host tools: ${missing[*]}"
    apt_get install -y -qq "${missing[@]}" >/dev/null || die "could not apt-get install ${missing[*]}"
  fi
}

build_containerd() {
  local v=$CONTAINERD_VERSION m=github.com/containerd/containerd/v2
  have_bin containerd "$v" && have_bin containerd-shim-runc-v2 "$v" && have_bin ctr "$v" && return
  # the version the CRI reports (kubectl get nodes -o wide: containerd://2.4.2)
  go_module_build containerd "$m" "$v" "-s -w -X $m/version.Version=${v#v} -X $m/version.Revision=$v" \
    "no_btrfs no_devmapper no_zfs" "$m/cmd/containerd" "$m/cmd/containerd-shim-runc-v2" "$m/cmd/ctr"
  local c
  for c in containerd containerd-shim-runc-v2 ctr; do
    install -m 0755 "$WORK/out/$c" "$BIN/$c" && record "$c" "$v"
  done
}

build_cni() {
  local v=$CNI_VERSION m=github.com/containernetworking/plugins p
  have cni-plugins "$v" && [[ -x $CNI_BIN/bridge && -x $CNI_BIN/host-local && -x $CNI_BIN/loopback && -x $CNI_BIN/portmap ]] \
    && return
  go_module_build cni-plugins "$m" "$v" "-s -w -X $m/pkg/utils/buildversion.BuildVersion=$v" "" \
    "$m/plugins/main/bridge" "$m/plugins/ipam/host-local" "$m/plugins/main/loopback" "$m/plugins/meta/portmap"
  for p in bridge host-local loopback portmap; do install -m 0755 "$WORK/out/$p" "$CNI_BIN/$p"; done
  record cni-plugins "$v"
}

build_multus() {
  local v=$MULTUS_VERSION m=gopkg.in/k8snetworkplumbingwg/multus-cni.v4
  have multus "$v" && [[ -x $CNI_BIN/multus && -f $NODE/nad-crd.yaml ]] && return
  go_module_build multus "$m" "$v" "-s -w -X $m/pkg/multus.version=$v" "" "$m/cmd/multus"
  install -m 0755 "$WORK/out/multus" "$CNI_BIN/multus"
  # the CRD is the first document of the module's daemonset manifest (the rest is the thick
  # plugin's DaemonSet, which the test bed does not run)
  local dir; dir=$(module_dir "$m" "$v")
  crd_document "$dir/deployments/multus-daemonset.yml" > "$NODE/nad-crd.yaml.tmp"
  grep -q 'name: network-attachment-definitions.k8s.cni.cncf.io' "$NODE/nad-crd.yaml.tmp" \
    || die "no NetworkAttachmentDefinition CRD in $dir/deployments/multus-daemonset.yml: has the module changed form?"
  mv "$NODE/nad-crd.yaml.tmp" "$NODE/nad-crd.yaml"
  record multus "$v"
}

crd_document() {  # the YAML document of FILE that is a CustomResourceDefinition
  awk '/^---/ { if (crd) exit; buf = ""; next } { buf = buf $0 "\n" }
       /^kind: CustomResourceDefinition/ { crd = 1 } END { if (crd) printf "%s", buf }' "$1"
}

build_coredns() {  # our module hack/coredns: rebuilt whenever its sources change
  local src="$REPO/hack/coredns" m=github.com/coredns/coredns release v
  release=$(awk -v m="$m" '($1 == m) { print $2 } ($1 == "require" && $2 == m) { print $3 }' "$src/go.mod")
  [[ -n "$release" ]] || die "$src/go.mod requires no $m"
  v="$release-$(own_module_hash "$src")"   # e.g. v1.13.1-0123456789ab
  have_bin coredns "$v" && return
  say "coredns $v: hack/coredns ($m $release, $(grep -c '"github.com/coredns/coredns/plugin/' "$src/main.go") plugins)"
  own_module_build coredns "$src" "-s -w -X $m/coremain.GitCommit=$release"
  install -m 0755 "$WORK/out/coredns" "$BIN/coredns" && record coredns "$v"
}

build_pause() {  # the sandbox image: a static program of ours, packed as an OCI image archive
  have pause "$PAUSE_VERSION" && [[ -f "$NODE/pause.tar" ]] && return
  local go; go=$(go_tool); go_env
  local mod="$WORK/pause-mod"
  mkdir -p "$mod" "$WORK/out"
  printf 'module holmes.local/pause\n\ngo 1.22\n' > "$mod/go.mod"
  cp "$REPO/hack/localkube/pause.go" "$mod/main.go"
  (cd "$mod" && "$go" build -ldflags "-s -w" -o "$WORK/out/pause" .) || die "building the pause program failed"
  (cd "$REPO" && PYTHONPATH=hack python3 -m holmes_dev.ociarchive "$WORK/out/pause" "$PAUSE_REF" "$NODE/pause.tar.tmp") \
    || die "packing the pause image failed"
  mv "$NODE/pause.tar.tmp" "$NODE/pause.tar" && record pause "$PAUSE_VERSION"
  say "pause: $PAUSE_REF in $NODE/pause.tar ($(du -k "$NODE/pause.tar" | cut -f1) KiB)"
}

# A module of ours under hack/ (go.mod, go.sum, *.go): its version is a hash of its sources.
own_module_hash() { cat "$1/go.mod" "$1/go.sum" "$1"/*.go | sha256sum | cut -c1-12; }

own_module_build() {  # own_module_build NAME SRC LDFLAGS: SRC's main package into $WORK/out/NAME
  local name=$1 src=$2 ldflags=$3 mod="$WORK/$1-mod" start=$SECONDS
  local go; go=$(go_tool); go_env
  rm -rf "$mod" && cp -r "$src" "$mod" && mkdir -p "$WORK/out"
  # -mod=readonly: the committed go.sum says what is built (download only, never edit)
  run_with_progress "$name" "$CACHE/build-$name.log" 30 go_build_cache_mb \
    bash -c 'cd "$1" && GOFLAGS="-mod=readonly -trimpath -buildvcs=false" go build -ldflags "$2" -o "$3/$4" .' \
    _ "$mod" "$ldflags" "$WORK/out" "$name"
  say "  $name: built in $((SECONDS - start))s"
}

build_dra_plugin() {  # our own module: rebuilt whenever its sources change (their hash is its version)
  local src="$REPO/hack/dra-plugin" v
  v=$(own_module_hash "$src")
  have_bin dra-plugin "$v" && return
  say "dra-plugin $v: hack/dra-plugin (k8s.io/dynamic-resource-allocation $(awk '$1 == "k8s.io/dynamic-resource-allocation" { print $2 }' "$src/go.mod"))"
  own_module_build dra-plugin "$src" "-s -w"
  install -m 0755 "$WORK/out/dra-plugin" "$BIN/dra-plugin" && record dra-plugin "$v"
}

main() {
  [[ -z "${1:-}" ]] || die "unknown argument $1: build-node.sh takes none"
  local start=$SECONDS
  ensure_tools
  build_containerd
  build_cni
  build_multus
  build_coredns
  build_pause
  build_dra_plugin
  say "node pieces ready in $((SECONDS - start))s: $(grep -E '^(containerd|cni-plugins|multus|coredns|pause|dra-plugin) ' "$BIN/.versions" | tr '\n' ' ')"
}

main "$@"
