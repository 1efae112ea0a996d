# The commands README.md gives a newcomer. `make test` is what .ci/run calls.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: venv test
venv: $(VENV)/.installed

# The product's distributions: every folder with a pyproject.toml of its own (contract/,
# operator/, trainer/), each installed editable; the root (pyproject.toml) ties them together
# and brings the test tools. Re-installed whenever any package metadata changes.
DISTRIBUTIONS := $(patsubst %/pyproject.toml,%,$(wildcard */pyproject.toml))
$(VENV)/.installed: pyproject.toml $(addsuffix /pyproject.toml,$(DISTRIBUTIONS))
	@echo ">> creating virtual environment in $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	@# a checkout made before the split had one distribution, `holmes`: its editable finder
	@# would shadow the three folders
	$(VENV)/bin/python -m pip uninstall --quiet --yes holmes 2>/dev/null || true
	@# DS_BUILD_OPS=0: DeepSpeed (a test dependency) installs without compiling CUDA/C++ ops
	DS_BUILD_OPS=0 $(VENV)/bin/python -m pip install --quiet $(addprefix -e ./,$(DISTRIBUTIONS)) -e '.[test]'
	touch $@

# The local control plane (hack/build-k8s.sh): built once, cached outside the repo.
HOLMES_CACHE ?= $(HOME)/.cache/holmes
export HOLMES_CACHE
TOPOLOGY ?= hack/topologies/default.yaml
LOCALKUBE := PYTHONPATH=hack $(PY) -m localkube

.PHONY: k8s clients node cluster-up cluster-down demo
k8s:
	@bash hack/build-k8s.sh
# What a real node runs beside the kubelet (hack/build-node.sh): containerd, the CNI plugins,
# Multus, CoreDNS, the pause image and the testbed's DRA kubelet plugin (hack/dra-plugin), cached
# beside the control plane. Needed by topologies with `playedBy: kubelet` nodes
# (hack/localkube/realnode.py).
node:
	@bash hack/build-k8s.sh node
	@bash hack/build-node.sh
# `node` too when the topology has real nodes
REAL_NODES = $(if $(shell grep -lE 'playedBy: *kubelet' $(TOPOLOGY) 2>/dev/null),node)
# kubectl and helm only (the unit tier's chart and kustomize checks): no control plane.
clients:
	@bash hack/build-k8s.sh clients
# The published OpenAPI v3 schemas of every Kubernetes release the chart supports (1.34 - 1.37,
# hack/k8s_openapi.py: from each release's k8s.io/kubernetes module, once, ~18 MB of zip each),
# which the unit tier checks every rendered object against (test_chart_k8s_schemas.py).
.PHONY: k8s-openapi
k8s-openapi:
	@$(PYTHON) hack/k8s_openapi.py

# The real Kueue (hack/build-kueue.sh: sigs.k8s.io/kueue's manager built from its module, its
# own config/default rendered), cached beside the control plane. `make kueue-up` (after
# cluster-up; idempotent) installs it on the local cluster and runs its manager as a host process
# (hack/localkube/kueue.py); `make kueue-down` stops it and removes its webhooks.
# (kubectl, which renders Kueue's manifests, comes from `make k8s` or `make clients`.)
.PHONY: kueue kueue-up kueue-down
kueue:
	@bash hack/build-kueue.sh
kueue-up: venv kueue
	@$(LOCALKUBE) kueue-up
kueue-down:
	@if [ -x $(PY) ]; then $(LOCALKUBE) kueue-down; fi

# The real JobSet controller (hack/build-jobset.sh: sigs.k8s.io/jobset's manager built from its
# module, its own config/default rendered), installed and run as Kueue is (hack/localkube/jobset.py).
# Run `make jobset-up` before `make kueue-up`: Kueue sets up its JobSet integration at start when
# JobSet's CRD is there (a Kueue started earlier finds it within its 2-minute backoff).
.PHONY: jobset jobset-up jobset-down
jobset:
	@bash hack/build-jobset.sh
jobset-up: venv jobset
	@$(LOCALKUBE) jobset-up
jobset-down:
	@if [ -x $(PY) ]; then $(LOCALKUBE) jobset-down; fi

# The real Kubeflow Trainer v2 controller (hack/build-kftrainer.sh: github.com/kubeflow/trainer/v2's
# cmd/trainer-controller-manager built from its module, its own manifests/ rendered with the default
# ClusterTrainingRuntimes), installed and run as JobSet is (hack/localkube/kftrainer.py). It needs
# JobSet: `make trainer-up` starts it first (idempotent, both).
.PHONY: trainer trainer-up trainer-down
trainer:
	@bash hack/build-kftrainer.sh
trainer-up: jobset-up trainer
	@$(LOCALKUBE) trainer-up
trainer-down:
	@if [ -x $(PY) ]; then $(LOCALKUBE) trainer-down; fi

# The two images of the Dockerfile (hack/build-images.sh), built into the local containers storage
# (`podman images`) on a Debian base; rebuilt only when what goes into them changes.
.PHONY: images
images:
	@bash hack/build-images.sh

# The framework tests' image, "the user's framework image" (hack/build-frameworks-image.sh,
# tests/images/frameworks.Containerfile): the trainer image plus megatron-core, torchtitan and
# DeepSpeed at the test extra's pins, for tests/e2e/frameworks on real nodes. A test fixture:
# `make e2e-on-real-nodes` builds it, `make images` and `make test` do not.
.PHONY: frameworks-image
frameworks-image: images
	@bash hack/build-frameworks-image.sh

# Every tier (tests/conftest.py): lint, then tests/unit, tests/integration and tests/e2e in one run.
test: venv k8s k8s-openapi kueue jobset trainer images lint
	$(PY) -m pytest

# The tiers one at a time (tests/conftest.py says what goes where).
#   unit: in-process tests, plus the chart's helm and kustomize renders (`make clients`): no
#     control plane, no images, no forked torch ranks. The edit-test loop: ~1,440 tests in
#     173 s of CPU (5 min wall on 2 cores shared with other work).
#   integration: whole programs (torchrun, pip, buildah, the benchmarks' small modes), forked torch
#     ranks, network namespaces; the image tests need `make images`.
#   e2e: against the local control plane (`make k8s`), the images' tests on it too.
.PHONY: unit integration e2e
unit: venv clients k8s-openapi
	$(PY) -m pytest tests/unit -q
integration: venv images
	$(PY) -m pytest tests/integration -q
e2e: venv k8s kueue jobset trainer images
	$(PY) -m pytest tests/e2e -q
# The tests on real kubelet nodes (marker real_nodes): not in `make test` until their cold build
# fits its budget (docs/local-cluster.md, Real nodes).
.PHONY: e2e-real-nodes
e2e-real-nodes: venv k8s node images
	HOLMES_REAL_NODES=1 $(PY) -m pytest -m real_nodes tests/e2e -q
# The e2e tier with the session cluster's six nodes played by the real kubelet
# (hack/topologies/default-real.yaml; the module map in docs/local-cluster.md, Real nodes):
# `make e2e-on-real-nodes E2E="tests/e2e/operator/test_operator_cluster.py ..."` for some modules.
# (frameworks-image: the framework tests' pods run it there; real nodes get it at their start.)
E2E ?= tests/e2e
.PHONY: e2e-on-real-nodes
e2e-on-real-nodes: venv k8s kueue jobset trainer node images frameworks-image
	HOLMES_E2E_TOPOLOGY=hack/topologies/default-real.yaml $(PY) -m pytest -m "not real_nodes" $(E2E) -q

# The compatibility tier (marker compat) on the oldest release the chart supports (its
# kubeVersion): that release's control plane and kubectl, built into the cache beside the default's.
COMPAT_K8S_VERSION ?= v1.34.4
.PHONY: compat
compat: venv k8s images
	HOLMES_K8S_VERSION=$(COMPAT_K8S_VERSION) bash hack/build-k8s.sh
	HOLMES_K8S_VERSION=$(COMPAT_K8S_VERSION) $(PY) -m pytest -m compat tests/e2e -q

# ruff: lint and format check; mypy: types (strict on contract/ and plan/); lint-imports: the
# layers' import contracts. Config in pyproject.toml; `make fmt` applies ruff's fixes.
.PHONY: lint fmt
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo
fmt: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Start (idempotent) the local cluster; writes .holmes/kubeconfig. TOPOLOGY=path picks the nodes.
cluster-up: venv k8s $(REAL_NODES)
	@$(LOCALKUBE) up --topology $(TOPOLOGY)

# Stop what cluster-up and multicluster-up started (by the PIDs they recorded in .holmes/).
cluster-down:
	@if [ -x $(PY) ]; then $(LOCALKUBE) down; $(LOCALKUBE) multicluster-down; fi

# Two member clusters (the default topology split by cluster: east = InfiniBand, west = RoCE),
# each its own control plane + node agent; east doubles as the hub. Writes .holmes/multicluster/.
.PHONY: multicluster-up demo-multicluster
multicluster-up: venv k8s $(REAL_NODES)
	@$(LOCALKUBE) multicluster-up --topology $(TOPOLOGY)

# One HolmesJob trained across both member clusters to Succeeded.
demo-multicluster: multicluster-up
	@PYTHONPATH=hack $(PY) hack/demo_multicluster.py

demo: images cluster-up
	@echo ">> the simulated nodes and how each advertises its NIC"
	@$(LOCALKUBE) nodes
	@# CRD + operator + a small HolmesJob trained to Succeeded: prints the layout and the metrics.
	@$(PY) hack/demo.py --kubeconfig .holmes/kubeconfig --job examples/holmesjob-demo.yaml

# Copy crds/ into the chart and re-render deploy/install.yaml (tests/unit/packaging checks both).
.PHONY: chart-sync crd
chart-sync:
	hack/chart-sync.sh

# Regenerate operator/holmes/plan/pipeline_bubble_table.json: each schedule's bubble, simulated on
# torch's own action orders (tests/unit/plan/test_pipeline_bubble_table.py checks it against torch).
bubble-table: venv
	$(PY) hack/gen_bubble_table.py

# Generate crds/holmesjob.yaml from the spec's declarations (contract/holmes/contract/) and the
# status' (hack/crdgen/status.py), then refresh its copies (tests/unit/contract/test_crd.py checks it).
crd: venv
	$(PY) hack/gen_crd.py
	hack/chart-sync.sh

# The kubectl plugin's krew archive (dist/) and manifest (deploy/krew/holmes.yaml, pinned to the
# archive's sha256; tests/unit/packaging/test_krew.py checks it). RELEASE_URL=... writes
# dist/krew-holmes.yaml pointing at the published archive instead.
.PHONY: krew
krew: venv
	$(PY) hack/krew.py

# A release in dist/ (hack/release.py): the chart packaged, the krew archive, one CycloneDX SBOM
# per image, the images' ids and digests (built first by `make images`), the bases and whether
# each is pinned by digest, release-VERSION.json and SHA256SUMS. A release build passes the bases
# by digest (PYTHON_IMAGE=...@sha256:... CUDA_IMAGE=...): hack/release.py says how.
.PHONY: release
release: venv clients images
	$(PY) hack/release.py --require-images
