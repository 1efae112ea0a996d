# Helpers shared by the hack/build-*.sh scripts (sourced, not run).
# The sourcing script sets LIB_TAG first: its name in the progress and error lines.

say() { printf '>> [%s] %s\n' "${LIB_TAG:?set LIB_TAG before sourcing hack/lib.sh}" "$*" >&2; }
die() { printf '!! [%s] %s\n' "${LIB_TAG:?set LIB_TAG before sourcing hack/lib.sh}" "$*" >&2; exit 1; }

# apt-get as root, or through sudo when available; `apt-get update` once per run.
APT_UPDATED=0
apt_get() {
  local sudo=()
  [[ $(id -u) -eq 0 ]] || { command -v sudo >/dev/null && sudo=(sudo -n); } \
    || die "need root (or sudo) for apt-get $*"
  if [[ $APT_UPDATED -eq 0 ]]; then
    say "apt-get update"
    "${sudo[@]}" apt-get update -qq || die "apt-get update failed (are the Debian package mirrors reachable?)"
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get "$@"
}

# Run CMD... in the background, its output to LOG; every EVERY seconds say WHAT's elapsed time
# and what the function PROGRESS prints (given LOG): a cold build is minutes long. Dies with the
# log's tail when CMD fails. CMD may be a shell function.
run_with_progress() {  # run_with_progress WHAT LOG EVERY PROGRESS CMD...
  local what=$1 log=$2 every=$3 progress=$4; shift 4
  local start=$SECONDS
  "$@" > "$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep "$every"
    kill -0 "$pid" 2>/dev/null && say "  $what: $((SECONDS - start))s, $("$progress" "$log")"
  done
  wait "$pid" || { tail -30 "$log" >&2; die "$what failed; full log: $log"; }
}

# ---- for the scripts that build Go programs from their modules (hack/build-*.sh) ----------------
# They set CACHE, BIN, WORK (this run's scratch) and GO_MIN_MINOR first.
# $BIN/.versions: lines "<piece> <version>"; a piece is rebuilt when it names another version.
built_version() { [[ -f "$BIN/.versions" ]] && awk -v b="$1" '$1 == b { print $2 }' "$BIN/.versions" || true; }
have() { [[ "$(built_version "$1")" == "$2" ]]; }            # have PIECE VERSION
have_bin() { [[ -x "$BIN/$1" ]] && have "$1" "$2"; }         # have_bin BINARY VERSION
record() {  # record PIECE VERSION
  local tmp="$BIN/.versions.tmp.$$"
  { [[ -f "$BIN/.versions" ]] && awk -v b="$1" '$1 != b' "$BIN/.versions"; echo "$1 $2"; } > "$tmp"
  mv "$tmp" "$BIN/.versions"
}

go_tool() {  # the machine's Go, checked against GO_MIN_MINOR; prints its path
  local go; go=$(command -v go || true)
  [[ -n "$go" ]] || die "Go is not on PATH: these programs build from their Go modules with Go 1.$GO_MIN_MINOR or newer (install Go, or put its bin/ on PATH)"
  local minor; minor=$("$go" env GOVERSION | sed -nE 's/^go1\.([0-9]+).*/\1/p')
  [[ -n "$minor" && "$minor" -ge $GO_MIN_MINOR ]] || die "$("$go" version) is too old: need Go 1.$GO_MIN_MINOR or newer"
  echo "$go"
}

# The environment every go command runs with: static binaries; the module cache and the build
# cache kept in $CACHE and shared by all of hack/'s builds. Go's build cache is safe for concurrent
# use and trims itself (entries unused for 5 days), and a package compiled for one program is
# reused by the next: kube-proxy after the control plane, Multus and the DRA plugin after
# Kubernetes' client libraries.
go_env() {
  export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOFLAGS="-mod=mod -trimpath -buildvcs=false" \
         CGO_ENABLED=0 GOTOOLCHAIN=local
}

go_build_cache_mb() { echo "build cache $(du -sm "$GOCACHE" 2>/dev/null | cut -f1) MB"; }

module_dir() {  # module_dir MODULE VERSION: its (read-only) directory in the module cache
  local go; go=$(go_tool); go_env
  local dir
  dir=$(cd "$WORK" && "$go" mod download -json "$1@$2" | sed -nE 's/^\s*"Dir": "(.*)",?$/\1/p') \
    || die "go mod download $1@$2 failed (is the Go module proxy reachable?)"
  [[ -d "$dir" ]] || die "no directory for $1@$2 in the module cache"
  echo "$dir"
}

# go_module_build NAME MODULE VERSION LDFLAGS TAGS PACKAGE...: build the packages of MODULE@VERSION
# into $WORK/out from a module of our own that requires it (Go ignores a dependency's replace
# directives, so `go install` and this build the same thing), printing progress.
go_module_build() {
  local name=$1 module=$2 version=$3 ldflags=$4 tags=$5; shift 5
  local go; go=$(go_tool); go_env
  local mod="$WORK/$name-mod" start=$SECONDS
  rm -rf "$mod" && mkdir -p "$mod" "$WORK/out"
  say "$name $version: $module (${*##*/})"
  printf 'module holmes.local/%s-build\n\ngo 1.%s\n\nrequire %s %s\n' "$name" "$GO_MIN_MINOR" "$module" "$version" > "$mod/go.mod"
  # each package at the version: a bare path asks the proxy for the module's version list
  (cd "$mod" && "$go" get "${@/%/@$version}" >"$WORK/go-get.log" 2>&1) \
    || { tail -20 "$WORK/go-get.log" >&2; die "resolving $module@$version failed (is the Go module proxy reachable?)"; }
  run_with_progress "$name" "$CACHE/build-$name.log" 30 go_build_cache_mb \
    bash -c 'cd "$1" && go build -tags "$2" -ldflags "$3" -o "$4/" "${@:5}"' _ "$mod" "$tags" "$ldflags" "$WORK/out" "$@"
  say "  $name: built in $((SECONDS - start))s"
}

# render_kustomize WHAT SRC SUBDIR OUT [EDIT]: `kubectl kustomize` of SUBDIR of a module's
# directory SRC into OUT (a project's own manifests, as its release renders them). SUBDIR's top
# folder is copied into $WORK first (the module cache is read-only); EDIT, a command, runs in
# $WORK on the copy before the render (SUBDIR may be a kustomization it writes). Dies unless the
# rendering holds a CRD.
render_kustomize() {
  local what=$1 src=$2 sub=$3 out=$4 edit=${5:-} top=${3%%/*}
  [[ -x "$BIN/kubectl" ]] || die "$BIN/kubectl is missing: run \`make clients\` (or hack/build-k8s.sh) first"
  [[ -d "$src/$top" ]] || die "$what in $src has no $top: has the module changed form?"
  rm -rf "${WORK:?}/$top" && cp -r "$src/$top" "$WORK/$top" && chmod -R u+w "$WORK/$top"
  [[ -z "$edit" ]] || (cd "$WORK" && $edit) || die "preparing $what's $top for kustomize failed"
  [[ -d "$WORK/$sub" ]] || die "$what in $src has no $sub: has the module changed form?"
  mkdir -p "$(dirname "$out")"
  "$BIN/kubectl" kustomize "$WORK/$sub" > "$out.tmp" || die "kubectl kustomize of $what's $sub failed"
  grep -q '^kind: CustomResourceDefinition' "$out.tmp" || die "$what's $sub rendered no CRD"
  mv "$out.tmp" "$out"
}
