#!/usr/bin/env bash
# Build the project's two images (the Dockerfile's `operator` and `trainer` targets) into the
# local containers storage (`podman images` lists them), without Docker or a registry:
#   localhost/holmes-base:bookworm      Debian bookworm from Debian's archive (mmdebstrap), standing
#                                       in for both base images (PYTHON_IMAGE and CUDA_IMAGE)
#   localhost/holmes-operator:VERSION   buildah, the Dockerfile unchanged
#   localhost/holmes-trainer:VERSION    same, with the CPU torch wheel this machine's pip finds
# The build has no network: pip installs from a wheelhouse that the host's pip (and its
# configuration) fills, mounted into the build; apt-get finds the Dockerfile's packages already in
# the base. Each piece is rebuilt only when its inputs change (cache keys in image labels):
#   base:       the package list (python + the Dockerfile's `apt-get install`s) and the recipe
#   wheelhouse: docker/constraints.txt and the requirements of the distributions (*/pyproject.toml)
#   images:     Dockerfile, .dockerignore, the build context's files, base, wheelhouse, this script
# The wheelhouse and the base's tarball live in ${HOLMES_CACHE:-$HOME/.cache/holmes}/images.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${HOLMES_CACHE:-$HOME/.cache/holmes}"
DIR="$CACHE/images"
SUITE=bookworm
# python:3.11-slim's role: python/pip on PATH, venv; the rest comes from the Dockerfile.
BASE_PYTHON_PACKAGES=(python3.11 python3-venv python3-pip python-is-python3)
# A build runtime that works with cgroup v1 + a non-empty cgroup v2 (hybrid), where crun refuses.
RUNTIME=runc

LIB_TAG=build-images
# say, die, apt_get
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sha()  { sha256sum | cut -c1-64; }
images_py() { (cd "$REPO" && PYTHONPATH=hack python3 -m holmes_dev.images "$@"); }
label() {  # label IMAGE KEY: the label's value, empty when the image or the label is missing
  podman image inspect --format "{{index .Labels \"$2\"}}" "$1" 2>/dev/null || true
}
image_id() { podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }

mkdir -p "$DIR"
REPLACED=()  # ids of images a rebuild replaced: removed at the end, the targets before the base

ensure_tools() {
  local missing=()
  command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)  # the base's root filesystem
  command -v buildah    >/dev/null || missing+=(buildah)     # builds the Dockerfile
  command -v podman     >/dev/null || missing+=(podman)      # lists, imports, mounts images
  command -v runc       >/dev/null || missing+=(runc)        # runs build steps and pods' containers
  command -v ip         >/dev/null || missing+=(iproute2)    # network namespaces for the runner's tests
  if ((${#missing[@]})); then
    say "installing host tools: ${missing[*]}"
    apt_get install -y -qq "${missing[@]}" >/dev/null || die "could not apt-get install ${missing[*]}"
  fi
  [[ $(id -u) -eq 0 ]] || die "building into the system's containers storage needs root (run as root or with sudo)"
  python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || die "python3 is $(python3 -V 2>&1): the wheelhouse is filled by the host's pip for the base's CPython 3.11 (Debian bookworm); run on bookworm or put a python3.11 first on PATH"
}

# ---- base ---------------------------------------------------------------------------------------
# The archive the base comes from: the host's own apt sources (same mirrors and keys).
apt_sources() {
  local f
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
    [[ -s "$f" ]] && { echo "$f"; return; }
  done
  die "no apt sources found in /etc/apt (needed for mmdebstrap)"
}

build_base() {
  local pkgs; mapfile -t pkgs < <(images_py apt-packages)
  mapfile -t pkgs < <(printf '%s\n' "${BASE_PYTHON_PACKAGES[@]}" "${pkgs[@]}" | awk '!seen[$0]++')
  # Merged /usr without the usrmerge package (and its perl); no docs, man pages or locales, as in
  # Debian's slim images; no apt sources left behind (the build has no network: the Dockerfile's
  # `apt-get install`s find their packages installed); no EXTERNALLY-MANAGED marker, so `pip`
  # installs into the system Python as python:3.11-slim's does.
  local opts=(--variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
              --aptopt='APT::Install-Recommends "false"'
              --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
              --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
              --customize-hook='rm -f "$1"/usr/lib/python3.*/EXTERNALLY-MANAGED "$1"/etc/apt/sources.list.d/* "$1"/etc/apt/sources.list'
              "--include=$(IFS=,; echo "${pkgs[*]}")")
  local config=('ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'ENV LANG=C.UTF-8'
                'CMD ["python3"]')
  local key; key=$(printf '%s\n' "$SUITE" "${opts[@]}" "${config[@]}" | sha)
  if [[ $(label "$BASE_REF" "$RECIPE_LABEL") == "$key" ]]; then
    say "base: cached $BASE_REF (Debian $SUITE: ${pkgs[*]})"
    return
  fi
  local tar="$DIR/base-$key.tar" start=$SECONDS
  if [[ ! -f "$tar" ]]; then
    say "base: Debian $SUITE with ${pkgs[*]} (mmdebstrap, 2-3 min)"
    rm -f "$DIR"/base-*.tar
    # (mmdebstrap picks its output format from the name: keep .tar)
    mmdebstrap "${opts[@]}" "$SUITE" "$DIR/partial-base.tar" "$(apt_sources)" > "$DIR/base.log" 2>&1 \
      || { rm -f "$DIR/partial-base.tar"; tail -20 "$DIR/base.log" >&2; die "mmdebstrap failed; full log: $DIR/base.log"; }
    mv "$DIR/partial-base.tar" "$tar"
  fi
  local old changes=() c; old=$(image_id "$BASE_REF")
  for c in "${config[@]}" "LABEL $RECIPE_LABEL=$key"; do changes+=(--change "$c"); done
  podman import --quiet "${changes[@]}" "$tar" "$BASE_REF" >/dev/null || die "podman import $tar failed"
  [[ -n "$old" ]] && REPLACED+=("$old")
  say "base: $BASE_REF ready in $((SECONDS - start))s"
}

# ---- wheelhouse ---------------------------------------------------------------------------------
# Every wheel the images install, fetched by the host's pip with the host's pip configuration
# (indexes, find-links, certificates) for the base's platform; builds read it with no index.
WHEELHOUSE=""
build_wheelhouse() {
  local reqs; mapfile -t reqs < <(images_py requirements)
  local key; key=$( { cat "$REPO/docker/constraints.txt"; printf '%s\n' "${reqs[@]}"; python3 -V; } | sha)
  WHEELHOUSE="$DIR/wheelhouse-${key:0:16}"
  if [[ -f "$WHEELHOUSE/pip.conf" ]]; then
    say "wheelhouse: cached $WHEELHOUSE"
    return
  fi
  say "wheelhouse: pip wheel ${reqs[*]} setuptools (pinned by docker/constraints.txt)"
  rm -rf "$DIR"/wheelhouse-* && mkdir -p "$WHEELHOUSE.part"
  local start=$SECONDS
  # setuptools: the wheel stage installs it to build the holmes wheel.
  python3 -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$WHEELHOUSE.part" \
      -c "$REPO/docker/constraints.txt" "${reqs[@]}" setuptools > "$DIR/wheelhouse.log" 2>&1 \
    || { tail -20 "$DIR/wheelhouse.log" >&2; rm -rf "$WHEELHOUSE.part"; die "pip wheel failed; full log: $DIR/wheelhouse.log"; }
  printf '[global]\nno-index = true\nfind-links = /wheelhouse\n' > "$WHEELHOUSE.part/pip.conf"
  mv "$WHEELHOUSE.part" "$WHEELHOUSE"
  say "wheelhouse: $(find "$WHEELHOUSE" -name '*.whl' | wc -l) wheels, $(du -sm "$WHEELHOUSE" | cut -f1) MB in $((SECONDS - start))s"
}

# ---- the Dockerfile's targets -------------------------------------------------------------------
# One Dockerfile target, built without network from the local wheelhouse.
buildah_build() {  # buildah_build TARGET KEY REF
  # --format docker keeps HEALTHCHECK (OCI image configs have no such field), as Docker would.
  cd "$REPO" && buildah build --runtime "$RUNTIME" --network none --format docker --target "$1" \
    --build-arg "PYTHON_IMAGE=$BASE_REF" --build-arg "CUDA_IMAGE=$BASE_REF" \
    --build-arg PIP_CONFIG_FILE=/wheelhouse/pip.conf --volume "$WHEELHOUSE:/wheelhouse:ro" \
    --label "$INPUTS_LABEL=$2" --tag "$3" .
}
buildah_step() { echo "at $(grep -oE '^\[[0-9]+/[0-9]+\] (STEP [0-9]+/[0-9]+: .{0,60}|COMMIT.*)' "$1" | tail -1)"; }

build_target() {  # build_target TARGET KEY
  local target=$1 key=$2 ref; ref=$(images_py ref "$target")
  if [[ $(label "$ref" "$INPUTS_LABEL") == "$key" ]]; then
    say "$target: cached $ref"
    return
  fi
  local old; old=$(image_id "$ref")
  local log="$DIR/build-$target.log" start=$SECONDS
  say "$target: buildah build --target $target (no network; log $log)"
  run_with_progress "building $target" "$log" 20 buildah_step \
    buildah_build "$target" "$key" "$ref"
  [[ -n "$old" && "$old" != "$(image_id "$ref")" ]] && REPLACED=("$old" "${REPLACED[@]}")
  say "$target: $ref built in $((SECONDS - start))s"
}

main() {
  local start=$SECONDS
  ensure_tools
  # One run at a time per cache (tests and demos of several checkouts share it).
  exec 9>"$DIR/.lock"
  flock -n 9 || { say "waiting for another build-images run"; flock 9; }
  local names; names=$(images_py names) || die "python3 -m holmes_dev.images failed"
  BASE_REF=$(sed -n 's/^BASE_REF=//p' <<<"$names")
  RECIPE_LABEL=$(sed -n 's/^RECIPE_LABEL=//p' <<<"$names")
  INPUTS_LABEL=$(sed -n 's/^INPUTS_LABEL=//p' <<<"$names")
  build_base
  build_wheelhouse
  local key; key=$( { images_py digest; image_id "$BASE_REF"; basename "$WHEELHOUSE"; declare -f build_target; } | sha)
  local t id
  for t in operator trainer; do build_target "$t" "$key"; done
  # A replaced image still used by a container (a pod running it) stays until that is gone.
  for id in "${REPLACED[@]}"; do podman rmi "$id" >/dev/null 2>&1 || true; done
  for t in operator trainer; do
    local ref; ref=$(images_py ref "$t")
    say "$ref: $(podman image inspect --format '{{.Size}}' "$ref" | awk '{printf "%.0f MB", $1/1e6}')"
  done
  say "images ready in $((SECONDS - start))s"
}

main "$@"
