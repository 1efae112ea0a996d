#!/usr/bin/env bash
# Build (once) and cache the real Kubeflow Trainer v2 controller for the test bed (make trainer-up),
# from the Go module proxy only, as hack/build-jobset.sh builds JobSet:
#   bin/trainer-controller-manager     github.com/kubeflow/trainer/v2's cmd/trainer-controller-manager
#   kftrainer/<version>/manifests.yaml `kubectl kustomize` of the module's own manifests/: the
#                                      overlay manifests/overlays/manager (CRDs, RBAC, webhooks, the
#                                      manager's config map and Deployment) without its third-party
#                                      JobSet (hack/build-jobset.sh builds that), and
#                                      manifests/overlays/runtimes (the default ClusterTrainingRuntimes,
#                                      torch-distributed among them)
# in ${HOLMES_CACHE:-$HOME/.cache/holmes} (bin/.versions says which release each is; the Go module
# cache go/mod is kept, so a rebuild is offline). Rebuilt when missing or another release.
# The manager is run as a host process by hack/localkube/kftrainer.py, not as the Deployment.
set -euo pipefail

CACHE="${HOLMES_CACHE:-$HOME/.cache/holmes}"
BIN="$CACHE/bin"
WORK="$CACHE/work-kftrainer"
MODULE=github.com/kubeflow/trainer/v2
TRAINER_VERSION="${HOLMES_KFTRAINER_VERSION:-v2.2.0}"   # the newest release the module proxy serves
GO_MIN_MINOR=25   # github.com/kubeflow/trainer/v2 v2.2's go.mod says `go 1.25.0`
MANIFESTS="$CACHE/kftrainer/$TRAINER_VERSION/manifests.yaml"

LIB_TAG=build-kftrainer
# say, die, have, have_bin, record, module_dir, go_module_build, render_kustomize
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ "$TRAINER_VERSION" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] \
  || die "HOLMES_KFTRAINER_VERSION=$TRAINER_VERSION: give a release as vMAJOR.MINOR.PATCH (e.g. v2.2.0)"

# The release's manager overlay pulls JobSet's release manifests from the network ("Comment this
# line if JobSet is installed on the Kubernetes cluster", it says): JobSet comes from its own
# module here. A kustomization of our own joins it with the runtimes' overlay.
prepare() {
  grep -q '^  - ../../third-party/jobset' manifests/overlays/manager/kustomization.yaml \
    || { echo "manifests/overlays/manager no longer names third-party/jobset" >&2; return 1; }
  sed -i '\#^  - ../../third-party/jobset#d' manifests/overlays/manager/kustomization.yaml
  mkdir -p manifests/holmes
  printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../overlays/manager\n  - ../overlays/runtimes\n' \
    > manifests/holmes/kustomization.yaml
}

render_manifests() {
  render_kustomize "Kubeflow Trainer $TRAINER_VERSION" "$1" manifests/holmes "$MANIFESTS" prepare
  grep -q '^kind: ClusterTrainingRuntime' "$MANIFESTS" \
    || die "Kubeflow Trainer's manifests/overlays/runtimes rendered no ClusterTrainingRuntime"
  record kftrainer-manifests "$TRAINER_VERSION"
}

main() {
  [[ -z "${1:-}" ]] || die "unknown argument $1: build-kftrainer.sh takes none (HOLMES_KFTRAINER_VERSION picks the release)"
  mkdir -p "$BIN"
  # One build at a time per cache (test runs of several checkouts share it): the others wait.
  exec 9>"$CACHE/.build-kftrainer.lock"
  command -v flock >/dev/null && flock 9
  local need_bin=1 need_manifests=1
  have_bin trainer-controller-manager "$TRAINER_VERSION" && need_bin=0
  [[ -f "$MANIFESTS" ]] && have kftrainer-manifests "$TRAINER_VERSION" && need_manifests=0
  if ((need_bin || need_manifests)); then
    rm -rf "$WORK" && mkdir -p "$WORK"
    ((need_manifests)) && render_manifests "$(module_dir "$MODULE" "$TRAINER_VERSION")"
    if ((need_bin)); then
      say "compiling trainer-controller-manager $TRAINER_VERSION (about 2.5 min on 2 cores from a cold build cache)"
      go_module_build kftrainer "$MODULE" "$TRAINER_VERSION" "-s -w" "" "$MODULE/cmd/trainer-controller-manager"
      install -m 0755 "$WORK/out/trainer-controller-manager" "$BIN/trainer-controller-manager" \
        && record trainer-controller-manager "$TRAINER_VERSION"
    fi
    rm -rf "$WORK"
  fi
  say "Kubeflow Trainer $TRAINER_VERSION ready: $BIN/trainer-controller-manager, $MANIFESTS"
}

main "$@"
