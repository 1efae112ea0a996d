#!/usr/bin/env bash
# Build the framework tests' image, "the user's framework image" (tests/images/frameworks.Containerfile),
# into the local containers storage: the trainer image of `make images` plus megatron-core,
# torchtitan and DeepSpeed at the pins of pyproject.toml's test extra. The framework tests
# (tests/e2e/frameworks) run it on real nodes, which run only images in their containerd (the
# node agent runs their pods as host processes of the venv, which has the frameworks). A test
# fixture: `make frameworks-image`, which `make e2e-on-real-nodes` runs; not `make images`, not
# `make test`.
#
# As hack/build-images.sh builds the trainer: no network in the build, pip installs from a
# wheelhouse the host's pip (and its configuration) fills, mounted into the build. The wheelhouse
# starts as hard links to the trainer's, so pip finds torch and the rest there and fetches only
# what the frameworks add; DeepSpeed's wheel is built with DS_BUILD_OPS=0 (no compiled ops, as
# `make venv` installs it). torch stays the trainer's (its pin in docker/constraints.txt, which
# pins torch's CUDA wheels in turn); the rest of the frameworks' closure resolves as in `make
# venv`, where it differs from the trainer's pins (torchtitan's `datasets` caps fsspec below
# docker/constraints.txt's). Each piece is rebuilt only when its inputs change:
#   wheelhouse: the framework pins, the torch pin, the trainer's wheelhouse, python3 -V
#   image:      the Containerfile, the trainer image's id, the wheelhouse, this script's build
#               (cache key in the image label dev.holmes.inputs)
# The wheelhouse lives in ${HOLMES_CACHE:-$HOME/.cache/holmes}/images/frameworks-wheelhouse-*.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${HOLMES_CACHE:-$HOME/.cache/holmes}"
DIR="$CACHE/images"
RUNTIME=runc  # as hack/build-images.sh: crun refuses this machine's cgroup layout
CONTAINERFILE=tests/images/frameworks.Containerfile

LIB_TAG=frameworks-image
# say, die, run_with_progress
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
sha()  { sha256sum | cut -c1-64; }
images_py() { (cd "$REPO" && PYTHONPATH=hack python3 -m holmes_dev.images "$@"); }
label() { podman image inspect --format "{{index .Labels \"$2\"}}" "$1" 2>/dev/null || true; }
image_id() { podman image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }

# ---- wheelhouse ---------------------------------------------------------------------------------
WHEELHOUSE=""
torch_pin() { grep -E '^torch==' "$REPO/docker/constraints.txt" || die "docker/constraints.txt pins no torch"; }
wheel_count() { echo "$(find "$1" -maxdepth 1 -name '*.whl' -newer "$1/.started" | wc -l) new wheels"; }
wheel_progress() { wheel_count "$WHEELHOUSE.part"; }  # (run_with_progress passes the log)
pip_wheel() {  # pip_wheel DIR REQUIREMENT...
  local dir=$1; shift
  DS_BUILD_OPS=0 python3 -m pip wheel --disable-pip-version-check --progress-bar off \
    --wheel-dir "$dir" --find-links "$dir" -c "$dir/constraints.txt" "$@"
}
build_wheelhouse() {  # build_wheelhouse TRAINER_WHEELHOUSE REQUIREMENT...
  local trainer=$1; shift
  local key; key=$( { printf '%s\n' "$@"; torch_pin; basename "$trainer"; python3 -V; } | sha)
  WHEELHOUSE="$DIR/frameworks-wheelhouse-${key:0:16}"
  if [[ -f "$WHEELHOUSE/pip.conf" ]]; then
    say "wheelhouse: cached $WHEELHOUSE"
    return
  fi
  rm -rf "$DIR"/frameworks-wheelhouse-* && mkdir -p "$WHEELHOUSE.part"
  # the trainer's wheels as links (same filesystem): pip takes a wheel already in its --wheel-dir
  cp -al "$trainer"/*.whl "$WHEELHOUSE.part/" && touch "$WHEELHOUSE.part/.started"
  torch_pin > "$WHEELHOUSE.part/constraints.txt"
  say "wheelhouse: pip wheel $* (DS_BUILD_OPS=0, $(torch_pin); log $DIR/frameworks-wheelhouse.log)"
  local start=$SECONDS
  # (a failed run's .part goes at the next)
  run_with_progress "pip wheel" "$DIR/frameworks-wheelhouse.log" 20 wheel_progress pip_wheel "$WHEELHOUSE.part" "$@"
  printf '%s\n' "$@" > "$WHEELHOUSE.part/requirements.txt"
  printf '[global]\nno-index = true\nfind-links = /wheelhouse\n' > "$WHEELHOUSE.part/pip.conf"
  mv "$WHEELHOUSE.part" "$WHEELHOUSE"
  say "wheelhouse: $(wheel_count "$WHEELHOUSE") ($(find "$WHEELHOUSE" -maxdepth 1 -name '*.whl' -newer "$WHEELHOUSE/.started" -print0 | du -cm --files0-from=- | tail -1 | cut -f1) MB) in $((SECONDS - start))s"
}

# ---- the image ----------------------------------------------------------------------------------
buildah_build() {  # buildah_build TRAINER KEY REF
  # the context is the Containerfile's folder alone; the trainer image is local (never pulled)
  cd "$REPO" && buildah build --runtime "$RUNTIME" --network none --pull=never --format docker \
    -f "$CONTAINERFILE" --build-arg "TRAINER_IMAGE=$1" \
    --build-arg PIP_CONFIG_FILE=/wheelhouse/pip.conf --volume "$WHEELHOUSE:/wheelhouse:ro" \
    --label "$INPUTS_LABEL=$2" --label "$BASE_LABEL=$(image_id "$1")" --tag "$3" "$(dirname "$CONTAINERFILE")"
}
buildah_step() { echo "at $(grep -oE '^(STEP [0-9]+/[0-9]+: .{0,60}|COMMIT.*)' "$1" | tail -1)"; }

main() {
  local start=$SECONDS
  command -v buildah >/dev/null && command -v podman >/dev/null \
    || die "buildah and podman are needed: run \`make images\` first (it installs them)"
  [[ $(id -u) -eq 0 ]] || die "building into the system's containers storage needs root (run as root or with sudo)"
  exec 9>"$DIR/.lock"  # hack/build-images.sh's: the trainer image and its wheelhouse stay put
  flock -n 9 || { say "waiting for another image build"; flock 9; }
  INPUTS_LABEL=$(images_py names | sed -n 's/^INPUTS_LABEL=//p')
  BASE_LABEL=dev.holmes.base-image
  local trainer ref; trainer=$(images_py ref trainer); ref=$(images_py test-ref frameworks)
  local trainer_id; trainer_id=$(image_id "$trainer")
  [[ -n "$trainer_id" ]] || die "$trainer is not built: run \`make images\` first"
  local wheelhouses=("$DIR"/wheelhouse-*/pip.conf)
  [[ -f "${wheelhouses[0]}" && ${#wheelhouses[@]} -eq 1 ]] \
    || die "need the trainer's one wheelhouse in $DIR (found ${#wheelhouses[@]}): run \`make images\` first"
  local reqs; mapfile -t reqs < <(images_py framework-requirements) || die "reading pyproject.toml's test extra failed"
  build_wheelhouse "$(dirname "${wheelhouses[0]}")" "${reqs[@]}"
  local key; key=$( { sha256sum < "$REPO/$CONTAINERFILE"; echo "$trainer_id"; basename "$WHEELHOUSE"; declare -f buildah_build; } | sha)
  if [[ $(label "$ref" "$INPUTS_LABEL") == "$key" ]]; then
    say "cached $ref ($(podman image inspect --format '{{.Size}}' "$ref" | awk '{printf "%.0f MB", $1/1e6}'))"
    return
  fi
  local old old_base; old=$(image_id "$ref"); old_base=$(label "$ref" "$BASE_LABEL")
  local log="$DIR/build-frameworks.log" t0=$SECONDS
  say "buildah build -f $CONTAINERFILE FROM $trainer (no network; log $log)"
  run_with_progress "building $ref" "$log" 20 buildah_step buildah_build "$trainer" "$key" "$ref"
  say "$ref built in $((SECONDS - t0))s"
  if [[ -n "$old" && "$old" != "$(image_id "$ref")" ]]; then
    podman rmi "$old" >/dev/null 2>&1 || true  # still used by a container (a pod): stays until that is gone
    # the trainer image it was built on, when `make images` replaced it since: its removal there
    # failed while this image was its child
    if [[ -n "$old_base" && "$old_base" != "$trainer_id" ]] \
        && [[ $(podman image inspect --format '{{len .RepoTags}}' "$old_base" 2>/dev/null) == 0 ]]; then
      podman rmi "$old_base" >/dev/null 2>&1 || true
    fi
  fi
  say "$ref: $(podman image inspect --format '{{.Size}}' "$ref" | awk '{printf "%.0f MB", $1/1e6}') (the trainer image $(podman image inspect --format '{{.Size}}' "$trainer" | awk '{printf "%.0f MB", $1/1e6}')); ready in $((SECONDS - start))s"
}

main "$@"
