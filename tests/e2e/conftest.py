"""The end-to-end tier's fixtures: a real local Kubernetes cluster, started only for tests that ask for it.

Fixtures
--------
``cluster`` (session scope)
    A running local control plane (kube-apiserver/controller-manager/scheduler of the release
    hack/build-k8s.sh builds, v1.37, + etcd) with the node agent simulating the nodes of
    ``hack/topologies/default.yaml``, and kwok playing any hollow node a test registers
    (``tests/helpers/operator/cluster_helpers.register_hollow``).
    ``HOLMES_E2E_TOPOLOGY=hack/topologies/default-real.yaml`` (``make e2e-on-real-nodes``) has
    the same six nodes played by the real kubelet on containerd instead (needs root, ``make
    node`` and the images; one such cluster per machine: kube-proxy). Started on
    first use in a private state dir (``.holmes/pytest-<pid>``, own ports) and stopped after
    the last test asking for it (tests/helpers/cluster/early_stop.py). Set
    ``HOLMES_KUBECONFIG=path`` to reuse a running cluster instead (e.g. after ``make
    cluster-up``: ``HOLMES_KUBECONFIG=.holmes/kubeconfig``); it is then left running.
    Attributes and methods:

    - ``kubeconfig``: path (str) of an admin kubeconfig.
    - ``kubectl(*args, check=True, input=None, timeout=60)`` -> ``subprocess.CompletedProcess``
      (text mode, stdout/stderr captured; raises ``AssertionError`` with stderr when ``check`` and
      the command fails).
    - ``api_client()`` -> a new ``kubernetes.client.ApiClient`` for the cluster.
    - ``topology``: the ``localkube.topology.Topology`` of the simulated nodes (``.nodes``, each a
      ``SimNode`` with ``name, cluster, nic, gbps, gpus, labels, allocatable``; ``.by_nic(kind)``).
    - ``state_dir``: the cluster's state dir (``Path``), or None for a reused cluster.
    - ``pod_log(namespace, pod, container)`` -> str: the container's output so far, every start
      appended after a ``==== localkube:`` header line; the file is
      ``<state_dir>/pods/<namespace>/<pod>/<container>.log``. ``kubectl logs [--previous]`` works
      too (the node agent serves the kubelet's log endpoint) and shows the current start only.
      On a real node it is ``kubectl logs --previous`` (after a restart) then ``kubectl logs``.
    - ``real_nodes``: whether any node is a real kubelet.
    - ``trainer_image``: an image every node runs, with a shell; ``framework_image(framework)``:
      the image of a framework test's pods (the built frameworks image on real nodes).
    - ``power(node, on)``: switch an agent's node off or on (not a real node's).
    - ``new_namespace(prefix="t")`` -> the name of a fresh namespace whose default service
      account exists (what the ``namespace`` fixture yields; for a module's own namespace).
    - ``wait_pod(namespace, name, phases=("Succeeded","Failed"), timeout=60)`` -> the pod as a dict
      once its ``status.phase`` is in ``phases`` (``AssertionError`` with the pod's status on time-out).

``member_clusters`` (session scope)
    Two local control planes, each with its node agent: the default topology split by cluster
    (``east``: ib-0, ib-1, eth-0; ``west``: roce-0, roce-1, eth-1), pod IPs distinct per cluster
    (``hack/localkube/multicluster.py``). ``east`` doubles as the hub. Started on first use in
    ``.holmes/pytest-multi-<pid>`` and stopped after the last test asking for it. Yields the
    ``MultiCluster`` (``members``, ``hub``, ``kubeconfig(member)``, ``kubectl(member, *args)``,
    ``register(namespace)``, ``ensure_namespace(ns)``, ``plane(member)``: its ``ControlPlane``).

``real_kueue`` (module scope)
    The real Kueue (``sigs.k8s.io/kueue``, built by hack/build-kueue.sh) on the ``cluster``: its
    own CRDs, RBAC and webhooks installed, its manager running as a host process configured as
    ``hack/localkube/kueue.py`` says (HolmesJob an external framework, no ``pod`` integration,
    ``waitForPodsReady``, TAS); started again with that configuration at each module's start
    if the module before changed it. Yields the ``localkube.kueue.Kueue``. The modules asking
    for ``real_kueue``, ``real_jobset`` or ``real_trainer`` run one after another, those with
    JobSet first, and share them; after the last, the managers are stopped and their CRDs
    deleted (with every object of their kinds), so tests of the stand-in CRDs
    (hack/thirdparty-crds) can follow on the same cluster. On a reused cluster
    (``HOLMES_KUBECONFIG``) whose Kueue ``make kueue-up`` started, that one is used and kept.

``real_jobset`` (module scope)
    The real JobSet controller (``sigs.k8s.io/jobset``, built by hack/build-jobset.sh) on the
    ``cluster``, installed and run as ``hack/localkube/jobset.py`` says. Ask for it before
    ``real_kueue`` (Kueue sets up its JobSet integration at start when JobSet's CRD is served).
    Yields the ``localkube.jobset.JobSet``; shared as ``real_kueue`` says, then stopped and
    JobSet's CRD deleted. On a reused cluster whose JobSet ``make jobset-up`` started, that one is
    used and kept.

``real_trainer`` (module scope)
    The real Kubeflow Trainer v2 controller (``github.com/kubeflow/trainer/v2``, built by
    hack/build-kftrainer.sh) on the ``cluster``, with its default ClusterTrainingRuntimes
    (torch-distributed, ...), installed and run as ``hack/localkube/kftrainer.py`` says; asks for
    ``real_jobset`` (Trainer renders each TrainJob into a JobSet). Yields the
    ``localkube.kftrainer.KFTrainer``; shared as ``real_kueue`` says, then stopped and Trainer's
    CRDs deleted. On a reused cluster whose Trainer ``make trainer-up`` started, that one
    is used and kept.

``namespace`` (function scope)
    A fresh namespace name (``t-<random>``) whose ``default`` service account and its token exist
    (so pods can be created at once); deleted after the test, without waiting.

Only tests under tests/e2e see these fixtures; a test elsewhere that starts a control plane
fails (tests/conftest.py), so none can slip into ``make unit`` or ``make integration``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from holmes_dev.kubectl import run_kubectl

from tests.helpers.cluster.early_stop import stop_after_last_user, stop_unneeded

REPO = Path(__file__).resolve().parents[2]


class LocalCluster:
    """What the ``cluster`` fixture yields; see the module docstring."""

    def __init__(self, kubeconfig: str, topology, state_dir: Path | None):
        from localkube.controlplane import binary

        self.kubeconfig = kubeconfig
        self.topology = topology
        self.state_dir = state_dir
        self._kubectl = binary("kubectl")

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        r = run_kubectl(self._kubectl, self.kubeconfig, *args, input=input, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
        return r

    def api_client(self):
        from kubernetes import config

        return config.new_client_from_config(self.kubeconfig)

    @property
    def real_node_names(self) -> list[str]:
        """The nodes the real kubelet plays (``playedBy: kubelet``, HOLMES_E2E_TOPOLOGY)."""
        from localkube.topology import KUBELET

        return list(self.topology.played_by(KUBELET).names)

    @property
    def real_nodes(self) -> bool:
        """Whether any node is a real kubelet."""
        return bool(self.real_node_names)

    @property
    def trainer_image(self) -> str:
        """An image every node runs, with a shell: the one the operators the tests start name
        (the built trainer image on real nodes; on the node agent the default, a host process)."""
        from holmes.operator.core.render import RenderSettings

        return os.environ.get("HOLMES_TRAINER_IMAGE") or RenderSettings.image

    def framework_image(self, framework: str) -> str:
        """The image of a framework test's pods (``spec.framework``; tests/e2e/frameworks), whose
        command is ``python <a program on a hostPath volume>``: on real nodes the user's framework
        image, the trainer image plus megatron-core, torchtitan and DeepSpeed (``make
        frameworks-image``; the test fails naming it when it is missing); on the node agent
        ``registry.example/<framework>:test``, a host process of the venv, which has them."""
        if not self.real_nodes:
            return f"registry.example/{framework}:test"
        from tests.helpers.cluster.real_nodes import FRAMEWORKS, require_image

        require_image(
            FRAMEWORKS,
            "make frameworks-image",
            " before the tests (real nodes take the images the storage holds when their cluster starts)",
        )
        return FRAMEWORKS

    def pod_log(self, namespace: str, pod: str, container: str) -> str:
        if self.real_nodes:
            r = self.kubectl("get", "pod", pod, "-n", namespace, "-o", "json", check=False)
            obj = json.loads(r.stdout) if r.returncode == 0 else {}
            if obj.get("spec", {}).get("nodeName") in self.real_node_names:
                return self._kubelet_log(namespace, obj, container)
        if self.state_dir is None:
            raise RuntimeError("pod logs are only reachable for a cluster this session started")
        p = self.state_dir / "pods" / namespace / pod / f"{container}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def _kubelet_log(self, namespace: str, pod: dict, container: str) -> str:
        """A real kubelet keeps a container's current start and the one before it: both, oldest
        first (an empty string before the container ever started)."""
        st = pod.get("status", {})
        statuses = st.get("initContainerStatuses", []) + st.get("containerStatuses", [])
        restarts = next((c.get("restartCount", 0) for c in statuses if c["name"] == container), 0)
        name = pod["metadata"]["name"]
        out = ""
        for prev in (["--previous"] if restarts else []) + [None]:
            args = ["logs", name, "-n", namespace, "-c", container] + ([prev] if prev else [])
            r = self.kubectl(*args, check=False)
            out += r.stdout if r.returncode == 0 else ""
        return out

    def power(self, node: str, on: bool) -> None:
        """Switch a node's machine off (its pods' processes die, no heartbeats, a deleted Node
        stays away) or on again (its kubelet, or the node agent, registers it anew)."""
        from localkube.__main__ import set_power
        from localkube.controlplane import ControlPlane

        if self.state_dir is None:
            raise RuntimeError("nodes can only be switched off in a cluster this session started")
        set_power(ControlPlane(self.state_dir), node, on)

    def get_json(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def new_namespace(self, prefix: str = "t") -> str:
        """A fresh namespace ``<prefix>-<random>`` whose default service account exists: pods
        are refused until it does (their token is requested per pod, TokenRequest)."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.kubectl("create", "namespace", name)
        end = time.monotonic() + 30
        while time.monotonic() < end:
            r = self.kubectl(
                "get", "serviceaccount", "default", "-n", name, "-o", "jsonpath={.metadata.name}", check=False
            )
            if r.returncode == 0 and r.stdout.strip():
                return name
            time.sleep(0.2)
        raise AssertionError(f"namespace {name}: its default service account never appeared")

    def wait_pod(
        self, namespace: str, name: str, phases=("Succeeded", "Failed"), timeout: float = 60
    ) -> dict:
        end = time.monotonic() + timeout
        pod: dict = {}
        while time.monotonic() < end:
            r = self.kubectl("get", "pod", name, "-n", namespace, "-o", "json", check=False)
            if r.returncode == 0:
                pod = json.loads(r.stdout)
                if pod.get("status", {}).get("phase") in phases:
                    return pod
            time.sleep(0.3)
        raise AssertionError(
            f"pod {namespace}/{name} not in {phases} after {timeout}s; "
            f"status: {json.dumps(pod.get('status'), indent=1)}"
        )


def _reap_abandoned_clusters() -> None:
    """Stop clusters of earlier pytest sessions that were killed before they could clean up."""
    import shutil

    from localkube.controlplane import ControlPlane, pid_alive

    for d in (REPO / ".holmes").glob("pytest-*"):
        pid = d.name.rsplit("-", 1)[1]
        if pid.isdigit() and not pid_alive(int(pid)):
            for sub in [d, *(x for x in d.iterdir() if (x / "cluster.json").exists())]:
                ControlPlane(sub).down(log=lambda m: None)
            shutil.rmtree(d, ignore_errors=True)


DEFAULT_TOPOLOGY = REPO / "hack" / "topologies" / "default.yaml"
E2E_TOPOLOGY_FIX = (
    "set it to hack/topologies/default-real.yaml (the default topology's nodes played by the real "
    "kubelet: `make e2e-on-real-nodes`) or unset it (default.yaml, the node agent)"
)


def e2e_topology() -> Path:
    """The topology the session's ``cluster`` runs: hack/topologies/default.yaml, or the file
    HOLMES_E2E_TOPOLOGY names (relative to the repository), which must have the same nodes
    (names, islands, NICs, labels, resources) played by someone else: the tests rely on them."""
    from localkube.topology import TopologyError, differences_but_players, load_topology

    raw = os.environ.get("HOLMES_E2E_TOPOLOGY", "").strip()
    if not raw:
        return DEFAULT_TOPOLOGY
    path = Path(raw) if Path(raw).is_absolute() else REPO / raw
    if not path.is_file():
        pytest.fail(f"HOLMES_E2E_TOPOLOGY={raw}: no such file; {E2E_TOPOLOGY_FIX}", pytrace=False)
    try:
        diff = differences_but_players(load_topology(DEFAULT_TOPOLOGY), load_topology(path))
    except TopologyError as e:
        pytest.fail(f"HOLMES_E2E_TOPOLOGY={raw}: {e}", pytrace=False)
    if diff:
        pytest.fail(
            f"HOLMES_E2E_TOPOLOGY={raw}: the e2e tests need default.yaml's nodes, only their "
            f"playedBy may differ: {'; '.join(diff)}; {E2E_TOPOLOGY_FIX}",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def cluster():
    from localkube.controlplane import ControlPlane
    from localkube.topology import load_topology

    reuse = os.environ.get("HOLMES_KUBECONFIG")
    if reuse:
        state_dir = Path(reuse).resolve().parent / "cluster"
        st = (
            json.loads((state_dir / "cluster.json").read_text())
            if (state_dir / "cluster.json").exists()
            else {}
        )
        topo = load_topology(st.get("topology") or REPO / "hack/topologies/default.yaml")
        yield LocalCluster(reuse, topo, state_dir if st else None)
        return
    _reap_abandoned_clusters()
    cp = ControlPlane(REPO / ".holmes" / f"pytest-{os.getpid()}")
    cp.dir.mkdir(parents=True, exist_ok=True)
    topo_path = e2e_topology()
    topo = load_topology(topo_path)
    trainer_image = os.environ.get("HOLMES_TRAINER_IMAGE")
    if topo.played_by("kubelet").nodes:
        from tests.helpers.cluster.real_nodes import TRAINER, require_real_nodes

        require_real_nodes()
        # A real node runs only images in its containerd: every operator the tests start (they
        # inherit the environment) names the built trainer image, as the chart's values do, not
        # the default holmes-trainer:latest that the node agent runs as a host process.
        os.environ.setdefault("HOLMES_TRAINER_IMAGE", TRAINER)

    def stop():
        cp.down(log=lambda m: None)
        shutil.rmtree(cp.dir, ignore_errors=True)
        if trainer_image is None:
            os.environ.pop("HOLMES_TRAINER_IMAGE", None)

    stop = stop_after_last_user("cluster", stop)
    try:
        cp.up(topo_path, log=lambda m: print(f"[localkube] {m}", file=sys.stderr))
        yield LocalCluster(str(cp.kubeconfig), topo, cp.dir)
    finally:
        stop()


@pytest.fixture(scope="session")
def member_clusters():
    from localkube.multicluster import MultiCluster

    _reap_abandoned_clusters()
    mc = MultiCluster(REPO / ".holmes" / f"pytest-multi-{os.getpid()}")

    def stop():
        mc.down(log=lambda m: None)
        shutil.rmtree(mc.root, ignore_errors=True)

    stop = stop_after_last_user("member_clusters", stop)
    try:
        mc.up(
            REPO / "hack" / "topologies" / "default.yaml",
            log=lambda m: print(f"[multicluster] {m}", file=sys.stderr),
        )
        yield mc
    finally:
        stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Once a test's fixtures are torn down, stop the session clusters no later test asks for
    (tests/helpers/cluster/early_stop.py says why)."""
    yield
    stop_unneeded(item, item.session.items)


KUEUE_STANDIN_CRDS = ("workloads.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io")
# The controllers a module installs for itself (real_jobset, real_kueue, real_trainer): the
# modules asking for any of them run one after another (pytest_collection_modifyitems), those
# with JobSet first (Kueue sets up its JobSet integration at start), and share what the first
# installed; the last of the run uninstalls them. Before, each of six modules installed and
# uninstalled Kueue (and four JobSet): about 20 s each time on a loaded machine.
SHARED_CONTROLLERS = ("real_jobset", "real_kueue", "real_trainer")


def _shared_controller_rank(item) -> int | None:
    """Where a module asking for a shared controller goes in the run: those with JobSet (0)
    before those with Kueue only (1); None: it asks for none."""
    names = set(item.fixturenames)
    if not names & set(SHARED_CONTROLLERS):
        return None
    return 0 if names & {"real_jobset", "real_trainer"} else 1


def pytest_collection_modifyitems(config, items):
    """Skip the node agent's own tests on real nodes; put the modules that ask for a shared
    controller together, where the first of them was."""
    agent_tests = [i for i in items if i.get_closest_marker("node_agent")]
    if agent_tests and os.environ.get("HOLMES_E2E_TOPOLOGY", "").strip():
        from localkube.topology import KUBELET, load_topology

        if load_topology(e2e_topology()).played_by(KUBELET).nodes:
            skip = pytest.mark.skip(reason="the node agent's own behaviour; these nodes are real kubelets")
            for item in agent_tests:
                item.add_marker(skip)
    modules: dict = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    ranks = {
        path: min((r for i in its if (r := _shared_controller_rank(i)) is not None), default=None)
        for path, its in modules.items()
    }
    sharing = sorted((p for p in modules if ranks[p] is not None), key=lambda p: ranks[p])
    if len(sharing) < 2:
        return
    first, ordered = next(p for p in modules if ranks[p] is not None), []
    for path in modules:
        if ranks[path] is None:
            ordered.append(path)
        elif path == first:
            ordered.extend(sharing)
    items[:] = [i for path in ordered for i in modules[path]]


def _next_module_shares(request) -> bool:
    """Whether the module run after this one asks for a shared controller."""
    items = request.session.items
    mine = [n for n, i in enumerate(items) if i.path == request.node.path]
    nxt = mine[-1] + 1 if mine else len(items)
    return nxt < len(items) and _shared_controller_rank(items[nxt]) is not None


_INSTALLED: dict = {}  # fixture name -> the controller this session installed and keeps for now


def _shared(request, cluster, name: str, make, start=None):
    """The body of a shared controller's fixture (see SHARED_CONTROLLERS): one `make X-up`
    started is used and kept; else this session's, installed by the first module asking and
    started (``start``, default its ``up()``) at each module's start: kept as it runs when its
    configuration is the default, which a module may have changed."""
    from localkube.controlplane import ControlPlane

    if cluster.state_dir is None:
        pytest.skip(f"{name} needs a cluster this session started, or one `make cluster-up` started")
    ctl = make(ControlPlane(cluster.state_dir))
    if ctl.running() and name not in _INSTALLED:
        yield ctl  # `make ...-up`'s: left as it is
        return
    tag = name.removeprefix("real_")
    (start or (lambda c: c.up(log=lambda m: print(f"[{tag}] {m}", file=sys.stderr))))(ctl)
    _INSTALLED[name] = ctl
    try:
        yield ctl
    finally:
        if not _next_module_shares(request):  # the last of the run: every shared one goes
            for installed in reversed([_INSTALLED.pop(n) for n in list(_INSTALLED)]):
                installed.uninstall()


@pytest.fixture(scope="module")
def real_kueue(request, cluster):
    from localkube.kueue import Kueue

    def start(kq):
        # the stand-in CRDs (hack/thirdparty-crds) are not Kueue's: take them away first
        for crd in KUEUE_STANDIN_CRDS:
            r = cluster.kubectl(
                "get", "crd", crd, "-o", "jsonpath={.metadata.labels.app\\.kubernetes\\.io/name}", check=False
            )
            if r.returncode == 0 and r.stdout.strip() != "kueue":
                cluster.kubectl("delete", "crd", crd, "--wait=true", "--timeout=60s")
        kq.up(log=lambda m: print(f"[kueue] {m}", file=sys.stderr))

    yield from _shared(request, cluster, "real_kueue", Kueue, start)


@pytest.fixture(scope="module")
def real_jobset(request, cluster):
    from localkube.jobset import JobSet

    yield from _shared(request, cluster, "real_jobset", JobSet)


@pytest.fixture(scope="module")
def real_trainer(request, cluster, real_jobset):
    from localkube.kftrainer import KFTrainer

    yield from _shared(request, cluster, "real_trainer", KFTrainer)


@pytest.fixture
def namespace(cluster):
    name = cluster.new_namespace()
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
