"""The node agent: plays the kubelet for every node of a topology, with local processes.

- Registers the topology's Nodes (labels, allocatable) and keeps them Ready (heartbeats).
- For each pod the scheduler binds to one of its nodes: gives it a network namespace of its own
  (podnet.py: `lo` and `eth0` on a bridge, an address in the pod subnet from CNI host-local
  IPAM, made by Debian's CNI plugins; `net1`... on a second bridge for a pod that asks for
  networks with Multus' `k8s.v1.cni.cncf.io/networks` annotation), or, for a `hostNetwork` pod,
  the host's namespace and a unique loopback IP 127.<octet>.x.y. Then it materializes the volumes,
  resolves the env and runs the init containers, then the one container. Each container's
  `image` decides how (imagepolicy.py):
  - in the local containers storage (`make images`): a real OCI container (container.py, runc):
    the image's root filesystem, user, ENTRYPOINT/CMD and env, in the pod's network namespace;
  - a host-image stand-in (cluster.json hostImages, default `*`, never a localhost/ name): a
    local process (the repo's .venv/bin first on PATH) inside `ip netns exec` (which also shows
    the pod only its own /sys/class/net) and `unshare --mount --uts`;
  - otherwise ErrImagePull, then ImagePullBackOff, as a kubelet that cannot pull.
  Either way with the pod's hostname, volumes bind-mounted at their mountPaths and a per-pod
  hosts file over /etc/hosts (no cluster DNS): pod DNS names map to pod IPs.
- The `kubernetes` Service: the API server listens on the host's 127.0.0.1 only; each pod in a
  namespace of its own gets 127.0.0.1:<api port> relayed to it (apiproxy.py), so in-cluster
  clients work unchanged.
- Reports phase, container states, exit codes and restart counts per restartPolicy; a deleted pod's
  container (or process group) gets SIGTERM, then SIGKILL after the grace period.
- Logs: <state-dir>/pods/<namespace>/<pod>/<container>.log (there is no `kubectl logs`).
- Power: the nodes named in <state-dir>/powered-off (`python -m localkube power off NODE`) are
  machines gone dark: their pods' processes are killed at once, nothing about them is reported,
  no heartbeat is sent and a deleted Node is not registered again until the node is powered on.

It is a test/demo harness, not a kubelet: no probes, no resource limits, no image pulls.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from . import container as ct
from . import imagepolicy, logserver, podnet, volumes
from . import podspec as ps
from .apiproxy import ApiForwarder
from .ociconfig import Mount
from .topology import AGENT, Topology, load_topology

log = logging.getLogger("localkube.agent")
REPO = Path(__file__).resolve().parents[2]
HEARTBEAT_S = 10.0
POWER_POLL_S = 0.5  # how often the powered-off file is read
POWERED_OFF = "powered-off"  # in the state dir: one node name per line
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
POD_MARKER = "LOCALKUBE_POD"  # env var naming the pod; lets `down` verify a PID before killing it
HACK_DIR = str(Path(__file__).resolve().parents[1])


def container_prefix(octet: int) -> str:
    """The runtime ids of one agent's containers start with this (it owns the octet)."""
    return f"lk{octet}-"


@dataclass
class PodRun:
    """What the agent knows about one pod it runs (keyed by uid)."""

    uid: str
    pod: dict
    ip: str
    dir: Path  # pods/<ns>/<name>/ : logs
    work: Path  # pods/<ns>/<name>/<uid>/ : volumes, hosts, specs
    step: int = 0  # index into containers(): init containers first, then the app
    proc: subprocess.Popen | None = None
    started_at: str = ""
    restarts: dict = field(default_factory=dict)  # container name -> restart count
    states: dict = field(default_factory=dict)  # container name -> state dict
    last: dict = field(default_factory=dict)  # container name -> lastState dict
    next_start: float = 0.0
    phase: str = "Pending"
    deleting: bool = False
    kill_deadline: float = 0.0
    gone: bool = False  # the API object no longer exists
    message: str = ""
    reason: str = ""
    volume_paths: dict | None = None
    net: podnet.PodNet | None = None  # its network namespace (None: hostNetwork, or torn down)
    extra_ifnames: list[str] = field(default_factory=list)
    api: ApiForwarder | None = None
    host_ip: str = "127.0.0.1"
    container: ct.Container | None = None  # the running OCI container (None: a host process)
    container_ids: dict = field(default_factory=dict)  # container name -> status containerID
    image_ids: dict = field(default_factory=dict)  # container name -> status imageID
    pull_failures: dict = field(default_factory=dict)  # container name -> failed pulls in a row

    @property
    def ns(self) -> str:
        return self.pod["metadata"]["namespace"]

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]

    def containers(self) -> list[tuple[bool, dict]]:
        spec = self.pod["spec"]
        return [(True, c) for c in spec.get("initContainers") or []] + [
            (False, c) for c in spec.get("containers") or []
        ]


class Agent:
    def __init__(
        self,
        state_dir: Path,
        topology: Topology,
        kubeconfig: Path,
        api_port: int,
        ip_octet: int,
        kubelet_port: int,
        host_images: tuple[str, ...] = imagepolicy.DEFAULT_HOST_IMAGES,
        api_host: str = "127.0.0.1",
    ):
        self.dir = state_dir
        self.api_host = api_host
        self.host_images = tuple(host_images)
        self.topology = topology
        self.nodes = set(topology.names)
        self.api_port = api_port
        self.octet = ip_octet
        self.kubelet_port = kubelet_port
        api = config.new_client_from_config(str(kubeconfig))
        self.core = client.CoreV1Api(api)
        self.q: queue.Queue = queue.Queue()
        self.runs: dict[str, PodRun] = {}
        self.ips: set[str] = set()
        self.services: list[dict] = []
        self.stop = threading.Event()
        self.hosts_dirty = False
        self.pgid_file = state_dir / "pods" / "pgids.json"
        self.mountpoints = state_dir / "pods" / "mountpoints.txt"
        self.powered_off: set[str] = set()
        self.network = podnet.PodNetwork(state_dir, ip_octet)

    # ---- API helpers ---------------------------------------------------------------------------
    def _get(self, kind: str, ns: str, name: str) -> dict | None:
        fn = self.core.read_namespaced_config_map if kind == "cm" else self.core.read_namespaced_secret
        try:
            obj = json.loads(fn(name, ns, _preload_content=False).data)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        if kind == "secret":
            return ps.decode_secret(obj.get("data"))
        return {**(obj.get("data") or {})}

    def configmap(self, ns: str, name: str) -> dict | None:
        return self._get("cm", ns, name)

    def secret(self, ns: str, name: str) -> dict | None:
        return self._get("secret", ns, name)

    def token(self, pod: dict, sa: str, audience: str | None, seconds: int) -> str:
        meta = pod["metadata"]
        spec: dict = {
            "expirationSeconds": max(600, seconds),
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
        }
        if audience:
            spec["audiences"] = [audience]
        r = self.core.create_namespaced_service_account_token(
            sa,
            meta["namespace"],
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return r.status.token

    def event(self, run: PodRun, reason: str, message: str, warning: bool = False) -> None:
        ts = ps.now_iso()
        body = {
            "metadata": {"generateName": f"{run.name}.", "namespace": run.ns},
            "involvedObject": {
                "kind": "Pod",
                "namespace": run.ns,
                "name": run.name,
                "uid": run.uid,
                "apiVersion": "v1",
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": "localkube-agent", "host": run.pod["spec"].get("nodeName")},
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(run.ns, body)
        except ApiException as e:  # e.g. the namespace is being deleted
            log.debug("event %s/%s %s not posted: %s", run.ns, run.name, reason, e.reason)

    # ---- nodes ---------------------------------------------------------------------------------
    def register_nodes(self) -> None:
        for n in self.topology.nodes:
            if n.name in self.powered_off:
                continue
            body = n.node_object()
            body["status"]["conditions"] = self._node_conditions()
            body["status"]["daemonEndpoints"] = {"kubeletEndpoint": {"Port": self.kubelet_port}}
            try:
                self.core.create_node(body)
            except ApiException as e:
                if e.status != 409:
                    raise
                self.core.patch_node(
                    n.name,
                    {
                        "metadata": {
                            "labels": body["metadata"]["labels"],
                            "annotations": body["metadata"]["annotations"],
                        }
                    },
                )
            self.core.patch_node_status(n.name, {"status": body["status"]})
            # The TaintNodesByCondition admission taints new nodes not-ready: lifted at once (the
            # node lifecycle controller would, on its next pass).
            node = json.loads(self.core.read_node(n.name, _preload_content=False).data)
            taints = node["spec"].get("taints") or []
            kept = [t for t in taints if t["key"] not in NOT_READY_TAINTS]
            if kept != taints:
                self.core.patch_node(n.name, {"spec": {"taints": kept or None}})
        log.info("registered nodes %s", ", ".join(self.topology.names))

    @staticmethod
    def _node_conditions() -> list[dict]:
        ts = ps.now_iso()
        conds = [
            ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID"),
            ("Ready", "True", "KubeletReady"),
        ]
        return [
            {
                "type": t,
                "status": s,
                "reason": r,
                "message": "localkube node agent",
                "lastHeartbeatTime": ts,
                "lastTransitionTime": ts,
            }
            for t, s, r in conds
        ]

    def read_power(self) -> None:
        """Apply <state-dir>/powered-off: kill what runs on nodes switched off, register the
        nodes switched on again."""
        try:
            off = set((self.dir / POWERED_OFF).read_text().split()) & self.nodes
        except OSError:
            off = set()
        for name in sorted(off - self.powered_off):
            for run in self.runs.values():
                if run.pod["spec"].get("nodeName") == name and run.proc is not None:
                    self.kill_pod(run)
            log.info("node %s powered off", name)
        back = self.powered_off - off
        self.powered_off = off
        if back:
            log.info("nodes %s powered on", ", ".join(sorted(back)))
            self.register_nodes()

    def on_node(self, run: PodRun) -> bool:
        """Whether the pod's node is powered on (a dark node reports nothing)."""
        return run.pod["spec"].get("nodeName") not in self.powered_off

    def heartbeat(self) -> None:
        for name in self.topology.names:
            if name in self.powered_off:
                continue
            try:
                self.core.patch_node_status(name, {"status": {"conditions": self._node_conditions()}})
            except ApiException as e:
                if e.status == 404:  # someone deleted the node: register it again
                    self.register_nodes()
                    return
                log.warning("heartbeat for %s failed: %s", name, e.reason)

    # ---- watching ------------------------------------------------------------------------------
    def watch_pods(self) -> None:
        """Feeds ("sync", [pods]) after each (re)list and ("event", type, pod) after that."""
        while not self.stop.is_set():
            try:
                resp = self.core.list_pod_for_all_namespaces(_preload_content=False)
                lst = json.loads(resp.data)
                self.q.put(("sync", lst["items"]))
                w = watch.Watch()
                for ev in w.stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=lst["metadata"]["resourceVersion"],
                    timeout_seconds=120,
                    allow_watch_bookmarks=False,
                ):
                    if self.stop.is_set():
                        w.stop()
                        break
                    if ev["type"] == "ERROR":
                        break  # e.g. 410 Gone: list again
                    self.q.put(("event", ev["type"], ev["raw_object"]))
            except Exception as e:  # API restarts, timeouts: list again after a pause
                if not self.stop.is_set():
                    log.warning("pod watch interrupted (%s); re-listing", e)
                    time.sleep(1)

    def poll_services(self) -> None:
        while not self.stop.wait(1.0):
            try:
                items = json.loads(self.core.list_service_for_all_namespaces(_preload_content=False).data)[
                    "items"
                ]
            except Exception as e:
                log.debug("service list failed: %s", e)
                continue
            self.q.put(("services", items))

    # ---- main loop -----------------------------------------------------------------------------
    def running(self, ns: str, name: str) -> bool:
        return any(
            r.ns == ns and r.name == name and not r.deleting and r.phase not in ("Succeeded", "Failed")
            for r in list(self.runs.values())
        )

    def run(self) -> None:
        self.network.claim()
        for cid in ct.remove_leftovers(container_prefix(self.octet)):  # the octet is ours now
            log.info("removed leftover container %s", cid)
        pki = self.dir / "pki"
        logs = logserver.serve(
            self.dir / "pods", pki / "kubelet.crt", pki / "kubelet.key", self.kubelet_port, self.running
        )
        self.register_nodes()
        threading.Thread(target=self.watch_pods, daemon=True, name="watch-pods").start()
        threading.Thread(target=self.poll_services, daemon=True, name="services").start()
        next_beat = time.monotonic() + HEARTBEAT_S
        next_power = 0.0
        while not self.stop.is_set():
            if time.monotonic() >= next_power:
                self.read_power()
                next_power = time.monotonic() + POWER_POLL_S
            try:
                item = self.q.get(timeout=0.1)
                while True:
                    try:
                        self.handle(item)
                    except Exception:  # an API hiccup must not take every node down
                        log.exception("handling %s", item[:2])
                    item = self.q.get_nowait()
            except queue.Empty:
                pass
            for run in list(self.runs.values()):
                if not self.on_node(run):
                    continue
                try:
                    self.advance(run)
                except Exception:
                    log.exception("pod %s/%s", run.ns, run.name)
            if self.hosts_dirty:
                self.write_hosts()
            if time.monotonic() >= next_beat:
                try:
                    self.heartbeat()
                except Exception:
                    log.exception("heartbeat")
                next_beat = time.monotonic() + HEARTBEAT_S
        logs.shutdown()
        self.shutdown()
        self.network.release()

    def handle(self, item: tuple) -> None:
        if item[0] == "services":
            if item[1] != self.services:
                self.services, self.hosts_dirty = item[1], True
            return
        if item[0] == "sync":
            pods = [p for p in item[1] if p["spec"].get("nodeName") in self.nodes]
            present = {p["metadata"]["uid"] for p in pods}
            for uid, run in list(self.runs.items()):
                if uid not in present:
                    self.on_gone(run)
            for p in pods:
                self.on_pod(p)
            return
        _, etype, pod = item
        if pod.get("spec", {}).get("nodeName") not in self.nodes:
            return
        if etype == "DELETED":
            run = self.runs.get(pod["metadata"]["uid"])
            if run:
                self.on_gone(run)
        else:
            self.on_pod(pod)

    def on_pod(self, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        run = self.runs.get(uid)
        md = pod["metadata"]
        if run is None:
            phase = pod.get("status", {}).get("phase", "Pending")
            if phase in ("Succeeded", "Failed"):
                if md.get("deletionTimestamp"):
                    self.force_delete(md["namespace"], md["name"], uid)
                return
            run = self.new_run(pod)
            if phase == "Running":  # the agent restarted: the old process is gone
                run.restarts = {
                    c["name"]: cs.get("restartCount", 0) + 1
                    for c, cs in zip(pod["spec"]["containers"], pod["status"].get("containerStatuses") or [])
                }
        run.pod = pod
        if md.get("deletionTimestamp") and not run.deleting:
            grace = md.get("deletionGracePeriodSeconds")
            self.terminate(run, 30 if grace is None else grace, "Killing", "Stopping container (pod deleted)")

    def on_gone(self, run: PodRun) -> None:
        run.gone = True
        if not run.deleting:
            self.terminate(run, 0, "Killing", "pod object removed")

    def new_run(self, pod: dict) -> PodRun:
        md = pod["metadata"]
        pdir = self.dir / "pods" / md["namespace"] / md["name"]
        run = PodRun(uid=md["uid"], pod=pod, ip="", dir=pdir, work=pdir / md["uid"])
        run.work.mkdir(parents=True, exist_ok=True)
        (run.work / "hosts").touch()
        self.runs[run.uid] = run
        self.hosts_dirty = True
        problem = self.unsupported(pod)
        if problem:
            run.reason, run.message = "Unsupported", problem
            self.finish(run, "Failed")
            self.event(run, "Unsupported", problem, warning=True)
            return run
        if pod["spec"].get("hostNetwork"):
            run.ip = self.alloc_ip()
            return run
        try:
            self.attach_network(run)
        except (podnet.NetworkError, OSError) as e:
            self.release_network(run)
            run.reason, run.message = "FailedCreatePodSandBox", f"pod network: {e}"
            self.event(run, "FailedCreatePodSandBox", run.message, warning=True)
            self.finish(run, "Failed")
        return run

    def attach_network(self, run: PodRun) -> None:
        """The pod's own namespace with its interfaces, and the API server reachable in it."""
        run.extra_ifnames = podnet.extra_interfaces(run.pod["metadata"].get("annotations"))
        run.net = self.network.add(run.uid, run.extra_ifnames)
        run.ip, run.host_ip = run.net.ip, podnet.host_address(self.network.subnet)
        run.api = ApiForwarder(run.net.path, self.api_port, self.api_host)

    def release_network(self, run: PodRun) -> None:
        """Stop the API relay, CNI DEL, delete the namespace (its processes are gone)."""
        if run.api is not None:
            run.api.stop()
            run.api = None
        if run.net is not None:
            self.network.delete(run.net, run.extra_ifnames)
            run.net = None

    @staticmethod
    def unsupported(pod: dict) -> str:
        containers = pod["spec"].get("containers") or []
        if len(containers) != 1:
            return (
                f"the local node agent runs exactly one container per pod (plus init containers); "
                f"this pod has {len(containers)}: {[c['name'] for c in containers]}"
            )
        return ""

    def alloc_ip(self) -> str:
        for i in range(250 * 250):
            ip = f"127.{self.octet}.{i // 250}.{i % 250 + 1}"
            if ip not in self.ips:
                self.ips.add(ip)
                return ip
        raise RuntimeError("out of pod IPs")

    # ---- pod state machine ---------------------------------------------------------------------
    def advance(self, run: PodRun) -> None:
        now = time.monotonic()
        if run.deleting:
            alive = run.proc is not None and run.proc.poll() is None
            if alive and now >= run.kill_deadline:
                self.kill_pod(run)
            if alive:
                return
            if run.proc is not None:
                self.kill_pod(run)  # leftovers
                run.proc = None
            if not run.gone:
                self.force_delete(run.ns, run.name, run.uid)
            self.forget(run)
            return
        if run.phase in ("Succeeded", "Failed"):
            return
        if run.proc is None:
            if now >= run.next_start:
                self.start(run)
            return
        code = run.proc.poll()
        if code is not None:
            self.exited(run, code)

    def start(self, run: PodRun) -> None:
        is_init, c = run.containers()[run.step]
        pod = run.pod
        node = self.topology.node(pod["spec"]["nodeName"])
        # Downward API reads status.podIP/hostIP: fill them in before resolving.
        pod.setdefault("status", {}).update(
            {"podIP": run.ip, "podIPs": [{"ip": run.ip}], "hostIP": run.host_ip}
        )
        image = self.image_decision(c)
        if image.kind == "pull_error":
            self.pull_failed(run, c, image)
            return
        run.pull_failures.pop(c["name"], None)
        try:
            if image.kind == "container" and os.geteuid() != 0:
                raise ps.Unsupported(f"running image {image.ref} as a container needs root (runc, overlays)")
            if run.volume_paths is None:
                run.volume_paths = volumes.materialize(pod, run.work, self.configmap, self.secret, self.token)
            base = self.base_env(run) if image.kind == "host" else self.service_env(run)
            env = ps.resolve_env(pod, c, base, self.configmap, self.secret, node.allocatable)
            argv = ps.container_argv(c, env) if image.kind == "host" else []
            mounts = volumes.mounts_for(c, run.volume_paths)
        except ps.ConfigError as e:
            run.states[c["name"]] = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
            run.next_start = time.monotonic() + 2
            if run.message != str(e):
                run.message = str(e)
                self.event(run, "Failed", f"Error: {e}", warning=True)
                self.report(run)
            return
        except ps.Unsupported as e:
            self.fail_container(run, c, "Unsupported", str(e))
            return
        run.message = ""
        if self.hosts_dirty:  # the pod's own name must resolve from its first instruction on
            self.write_hosts()
        if image.kind == "container":
            self.start_container(run, c, image, env, mounts)
            return
        run.container_ids[c["name"]] = f"localkube://{run.uid}/{c['name']}"
        run.image_ids[c["name"]] = imagepolicy.HOST_IMAGE_ID
        if run.restarts.get(c["name"], 0) == 0 and run.step == 0:
            self.event(run, "HostProcess", image.message)
        workdir = c.get("workingDir") or ""
        if not (workdir and os.path.isdir(workdir)):
            workdir = str(run.work / "workdir")
            os.makedirs(workdir, exist_ok=True)
        spec = {
            "hostname": ps.pod_hostname(pod)[:63],
            "hosts": str(run.work / "hosts"),
            "mounts": mounts,
            "cwd": workdir,
            "argv": argv,
            "env": env,
            "mountpoints": str(self.mountpoints),
            "preserve": sorted({str(REPO), os.environ.get("LOCALKUBE_VENV", str(REPO))}),
        }
        spec_path = run.work / f"{c['name']}.spec.json"
        spec_path.write_text(json.dumps(spec))
        sandbox = (
            ["unshare", "--mount", "--uts"]
            if os.geteuid() == 0
            else ["unshare", "--user", "--map-root-user", "--mount", "--uts"]
        )
        if run.net is not None:
            sandbox = ["ip", "netns", "exec", run.net.netns, *sandbox]
        n = run.restarts.get(c["name"], 0)
        with open(run.dir / f"{c['name']}.log", "ab") as logf:  # the child keeps its own descriptor
            logf.write(
                f"==== localkube: {run.ns}/{run.name} container {c['name']} "
                f"start #{n} at {ps.now_iso()}\n".encode()
            )
            logf.flush()
            run.proc = subprocess.Popen(
                [*sandbox, sys.executable, "-m", "localkube.podexec", str(spec_path)],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                env={
                    "PYTHONPATH": HACK_DIR,
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    POD_MARKER: env[POD_MARKER],
                },
            )
        self.save_pgids()
        self.started(run, c, is_init, f"pid {run.proc.pid}")

    def started(self, run: PodRun, c: dict, is_init: bool, what: str) -> None:
        run.started_at = ps.now_iso()
        run.states[c["name"]] = {"running": {"startedAt": run.started_at}}
        run.phase = "Pending" if is_init else "Running"
        self.event(run, "Started", f"Started container {c['name']} ({what})")
        self.report(run)

    # ---- images --------------------------------------------------------------------------------
    def image_decision(self, c: dict) -> imagepolicy.Decision:
        image = c.get("image") or ""
        try:
            local = ct.local_image_id(imagepolicy.normalize(image))
        except ValueError:
            local = None
        return imagepolicy.decide(image, local, self.host_images)

    def pull_failed(self, run: PodRun, c: dict, image: imagepolicy.Decision) -> None:
        """ErrImagePull, then ImagePullBackOff, retried with back-off (the pod stays Pending): an
        image built later (`make images`) starts it, as a registry coming back would."""
        n = run.pull_failures[c["name"]] = run.pull_failures.get(c["name"], 0) + 1
        reason = "ErrImagePull" if n == 1 else "ImagePullBackOff"
        run.states[c["name"]] = {"waiting": {"reason": reason, "message": image.message}}
        run.next_start = time.monotonic() + ps.backoff_seconds(n)
        if n == 1:
            self.event(run, "Failed", f"Failed to pull image {c.get('image')!r}: {image.message}", True)
        self.report(run)

    def fail_container(self, run: PodRun, c: dict, reason: str, message: str) -> None:
        """The container cannot be run here at all: the pod fails, naming why."""
        run.reason, run.message = reason, message
        run.states[c["name"]] = {
            "terminated": {
                "exitCode": 128,
                "reason": reason,
                "message": message,
                "startedAt": ps.now_iso(),
                "finishedAt": ps.now_iso(),
            }
        }
        self.event(run, reason, message, warning=True)
        self.finish(run, "Failed")

    def start_container(
        self, run: PodRun, c: dict, image: imagepolicy.Decision, env: dict, mounts: list[dict]
    ) -> None:
        """Run the container from its image (container.py): one runtime container per start."""
        is_init = run.step < len(run.pod["spec"].get("initContainers") or [])
        n = run.restarts.get(c["name"], 0)
        command, args = ps.container_command(c, env)
        cid = f"{container_prefix(self.octet)}{run.uid}-{run.step}"
        bundle = run.work / "containers" / f"{run.step}-{n}"
        shutil.rmtree(bundle, ignore_errors=True)
        req = ct.ContainerRequest(
            id=cid,
            image=image.ref,
            bundle=bundle,
            hostname=ps.pod_hostname(run.pod)[:63],
            command=command,
            args=args,
            env=env,
            mounts=[Mount(str(run.work / "hosts"), "/etc/hosts", ro=True)]
            + [Mount(m["src"], m["dst"], m["ro"]) for m in mounts],
            netns=run.net.path if run.net is not None else None,
            working_dir=c.get("workingDir") or "",
            security_context=c.get("securityContext"),
            pod_security_context=run.pod["spec"].get("securityContext"),
        )
        with open(run.dir / f"{c['name']}.log", "ab") as logf:
            logf.write(
                f"==== localkube: {run.ns}/{run.name} container {c['name']} start #{n} at {ps.now_iso()} "
                f"(image {image.ref}, runtime id {cid})\n".encode()
            )
            logf.flush()
            try:
                run.container = ct.start(req, stdout=logf)
            except (ps.Unsupported, RuntimeError, OSError) as e:
                shutil.rmtree(bundle, ignore_errors=True)
                self.fail_container(run, c, "CreateContainerError", f"image {image.ref}: {e}")
                return
        run.proc = run.container.proc
        run.container_ids[c["name"]] = f"runc://{cid}"
        run.image_ids[c["name"]] = f"sha256:{image.image_id}"
        self.save_pgids()
        self.started(run, c, is_init, f"image {image.ref}")

    def exited(self, run: PodRun, code: int) -> None:
        is_init, c = run.containers()[run.step]
        self.kill_pod(run)  # the container is gone: so is what it left running
        if code < 0:
            code = 128 - code  # killed by a signal, like container runtimes report
        run.proc = None
        self.save_pgids()
        term = ps.terminated_state(code, run.started_at, ps.now_iso(), run.container_ids.get(c["name"], ""))
        policy = run.pod["spec"].get("restartPolicy", "Always")
        if is_init and code == 0:
            run.states[c["name"]] = term
            run.step += 1
            self.report(run)
            return
        if ps.restart_wanted("OnFailure" if is_init and policy == "Always" else policy, code):
            n = run.restarts[c["name"]] = run.restarts.get(c["name"], 0) + 1
            delay = ps.backoff_seconds(n)
            run.last[c["name"]] = term
            run.states[c["name"]] = {
                "waiting": {
                    "reason": "CrashLoopBackOff" if code else "Completed",
                    "message": f"back-off {delay:g}s restarting container {c['name']}",
                }
            }
            run.next_start = time.monotonic() + delay
            if code:
                self.event(
                    run,
                    "BackOff",
                    f"Back-off restarting failed container {c['name']} (exit {code})",
                    warning=True,
                )
            self.report(run)
            return
        run.states[c["name"]] = term
        self.finish(run, "Succeeded" if code == 0 and not is_init else "Failed")

    def finish(self, run: PodRun, phase: str) -> None:
        run.phase = phase
        self.release_network(run)  # like a kubelet tearing down a finished pod's sandbox
        if run.volume_paths is not None:
            volumes.cleanup(run.work, run.uid)  # memory-backed emptyDirs free their RAM now
        self.report(run)

    def terminate(self, run: PodRun, grace: float, reason: str, message: str) -> None:
        run.deleting = True
        run.kill_deadline = time.monotonic() + max(0.0, float(grace))
        if run.proc is not None and run.proc.poll() is None:
            self.signal(run, signal.SIGTERM if grace > 0 else signal.SIGKILL)
            if not run.gone:
                self.event(run, reason, message)

    def signal(self, run: PodRun, sig: int) -> None:
        """To the container's init through the runtime (killpg would reach runc, not the
        container), or to a host process's group."""
        if run.container is not None:
            run.container.signal(sig)
        else:
            self.killpg(run.proc, sig)

    def kill_pod(self, run: PodRun) -> None:
        """SIGKILL all the pod runs, as a container runtime kills a pod's cgroup: its container
        (killed and deleted by the runtime), or its process group and every process that left the
        group but carries the pod's marker (torchrun starts its workers in sessions of their own)."""
        if run.container is not None:
            run.container.cleanup()
            run.container = None
        else:
            self.killpg(run.proc, signal.SIGKILL)
        marker = f"{POD_MARKER}={self.dir}:{run.ns}/{run.name}".encode()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                if marker in (d / "environ").read_bytes().split(b"\0"):
                    os.kill(int(d.name), signal.SIGKILL)
            except OSError:
                pass

    @staticmethod
    def killpg(proc: subprocess.Popen | None, sig: int) -> None:
        if proc is None:
            return
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if sig == signal.SIGKILL:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def force_delete(self, ns: str, name: str, uid: str) -> None:
        try:
            self.core.delete_namespaced_pod(
                name,
                ns,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
                ),
            )
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("could not delete pod %s/%s: %s", ns, name, e.reason)

    def forget(self, run: PodRun) -> None:
        self.runs.pop(run.uid, None)
        self.ips.discard(run.ip)
        self.release_network(run)
        volumes.cleanup(run.work, run.uid)
        shutil.rmtree(run.work, ignore_errors=True)
        self.hosts_dirty = True
        self.save_pgids()

    # ---- status --------------------------------------------------------------------------------
    def report(self, run: PodRun) -> None:
        if run.gone:
            return
        pod = run.pod
        init_specs = pod["spec"].get("initContainers") or []
        app = (pod["spec"].get("containers") or [])[:1]
        running = run.phase == "Running" and run.proc is not None

        def statuses(specs, ready_if_running):
            out = []
            for c in specs:
                st = run.states.get(c["name"]) or {"waiting": {"reason": "PodInitializing"}}
                out.append(
                    ps.container_status(
                        c,
                        st,
                        run.restarts.get(c["name"], 0),
                        run.last.get(c["name"]),
                        ready_if_running and "running" in st,
                        run.container_ids.get(c["name"], ""),
                        run.image_ids.get(c["name"], ""),
                    )
                )
            return out

        initialized = run.step >= len(init_specs)
        status = {
            "phase": run.phase,
            "hostIP": run.host_ip,
            "podIP": run.ip or None,
            "podIPs": [{"ip": run.ip}] if run.ip else None,
            "startTime": pod.get("status", {}).get("startTime") or ps.now_iso(),
            "conditions": ps.pod_conditions(initialized, running, ps.now_iso()),
            "containerStatuses": statuses(app, True),
            "reason": run.reason or None,
            "message": run.message or None,
        }
        if init_specs:
            status["initContainerStatuses"] = statuses(init_specs, False)
        try:
            # A JSON merge patch replaces lists and container states whole (a strategic merge
            # patch would keep an old `waiting` next to a new `running`).
            self.core.api_client.call_api(
                f"/api/v1/namespaces/{run.ns}/pods/{run.name}/status",
                "PATCH",
                header_params={"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
                body={"status": status},
                auth_settings=["BearerToken"],
                _preload_content=False,
            )
        except ApiException as e:
            if e.status != 404:
                log.warning("status of %s/%s not written: %s %s", run.ns, run.name, e.status, e.body)

    # ---- hosts files ---------------------------------------------------------------------------
    def base_env(self, run: PodRun) -> dict[str, str]:
        """A host process's environment before the pod's: the venv first on PATH."""
        venv = os.environ.get("LOCALKUBE_VENV", str(REPO / ".venv"))
        return {
            "PATH": f"{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "HOSTNAME": ps.pod_hostname(run.pod)[:63],
            **self.service_env(run),
        }

    def service_env(self, run: PodRun) -> dict[str, str]:
        """What the kubelet adds to every container (the `kubernetes` Service, relayed to the API
        server inside the pod's namespace), and the marker `down` finds pod processes by."""
        return {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self.api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(self.api_port),
            "KUBERNETES_PORT": f"tcp://127.0.0.1:{self.api_port}",
            POD_MARKER: f"{self.dir}:{run.ns}/{run.name}",
        }

    def write_hosts(self) -> None:
        """Rewrite every pod's hosts file in place (same inode: it is bind-mounted)."""
        self.hosts_dirty = False
        entries = []
        live = [r for r in self.runs.values() if not r.deleting and r.ip]
        for r in live:
            entries += [(r.ip, n, scope) for n, scope in ps.host_names(r.pod)]
        for svc in self.services:
            sel = svc.get("spec", {}).get("selector")
            ips = [
                r.ip
                for r in live
                if r.ns == svc["metadata"]["namespace"]
                and ps.selector_matches(sel, r.pod["metadata"].get("labels"))
            ]
            for ip in sorted(ips, key=lambda s: tuple(int(x) for x in s.split("."))):
                entries += [(ip, n, scope) for n, scope in ps.service_names(svc)]
        for r in self.runs.values():
            if not r.ip:
                continue
            text = ps.render_hosts(r.pod, r.ip, entries)
            try:
                with open(r.work / "hosts", "r+") as f:
                    if f.read() != text:
                        f.seek(0)
                        f.write(text)
                        f.truncate()
            except OSError:
                pass

    # ---- shutdown ------------------------------------------------------------------------------
    def save_pgids(self) -> None:
        pg = {str(r.proc.pid): f"{r.ns}/{r.name}" for r in self.runs.values() if r.proc is not None}
        tmp = self.pgid_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(pg))
        tmp.replace(self.pgid_file)

    def shutdown(self) -> None:
        live = [r for r in self.runs.values() if r.proc is not None and r.proc.poll() is None]
        for r in live:
            self.signal(r, signal.SIGTERM)
        procs = [r.proc for r in live if r.proc is not None]
        end = time.monotonic() + 5
        while any(p.poll() is None for p in procs) and time.monotonic() < end:
            time.sleep(0.1)
        for r in list(self.runs.values()):
            if r.proc is not None:
                self.kill_pod(r)
            volumes.cleanup(r.work, r.uid)
            self.release_network(r)
        self.save_pgids()
        remove_mountpoints(self.mountpoints)
        ct.release_images()
        log.info("node agent stopped")


def other_pods_running() -> bool:
    """Whether any localkube pod process (of any cluster on this machine) is alive."""
    marker = f"{POD_MARKER}=".encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker in (d / "environ").read_bytes():
                    return True
            except OSError:
                pass
    return False


def remove_mountpoints(path: Path) -> None:
    """Remove the empty mount points podexec had to create on the root filesystem. Skipped while
    pods of another cluster run: removing a directory they have mounted would unmount it there."""
    try:
        created = sorted(set(path.read_text().split("\n")) - {""}, key=len, reverse=True)
    except OSError:
        return
    if other_pods_running():
        return
    for p in created:
        try:
            if os.path.isdir(p):
                os.rmdir(p)
            elif os.path.isfile(p) and os.path.getsize(p) == 0:
                os.unlink(p)
        except OSError:
            pass
    path.unlink(missing_ok=True)


def kill_recorded_pods(state_dir: Path) -> None:
    """SIGKILL pod process groups the agent recorded, if their leader still carries our marker."""
    f = state_dir / "pods" / "pgids.json"
    try:
        pgids = json.loads(f.read_text())
    except (OSError, ValueError):
        pgids = {}
    for pid in pgids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"{POD_MARKER}={state_dir}:".encode() in environ:
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except OSError:
                pass
    f.unlink(missing_ok=True)
    remove_mountpoints(state_dir / "pods" / "mountpoints.txt")


def main(state_dir: str) -> None:
    d = Path(state_dir).resolve()
    st = json.loads((d / "cluster.json").read_text())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    (d / "pods").mkdir(exist_ok=True)
    agent = Agent(
        d,
        load_topology(st["topology"]).played_by(AGENT),  # kubelets play the others (realnode.py)
        d / "kubeconfig",
        st["apiserverPort"],
        st["podIPOctet"],
        st["kubeletPort"],
        tuple(st.get("hostImages", imagepolicy.DEFAULT_HOST_IMAGES)),
        st.get("apiserverHost") or "127.0.0.1",  # a real node's bridge address (realnode.py)
    )
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    agent.run()
