# Helpers shared by hack/build-k8s.sh and hack/build-images.sh (sourced, not run).
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
