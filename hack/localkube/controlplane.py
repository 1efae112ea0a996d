"""Start and stop a real Kubernetes control plane on loopback (the release hack/build-k8s.sh
builds), plus what plays the topology's nodes: the node agent (whose pods get network namespaces
of their own: podnet.py), real kubelets (realnode.py) and one kwok process for all the hollow
nodes (``playedBy: kwok``, and any a test registers later; hollow.py registers them).

Everything lives in one state directory (``.holmes/cluster`` for ``make cluster-up``)::

    cluster.json        ports, pod-IP octet, topology path, recorded PIDs
    kubeconfig          admin kubeconfig (token auth, the apiserver's self-signed CA)
    kwok.yaml           kwok's configuration and Holmes' Stages
    pki/                apiserver cert (made by the apiserver), service-account key pair
    etcd/               etcd data
    logs/<component>.log
    pods/<namespace>/<pod>/   per pod: <container>.log, volumes, hosts file (see agent.py)

Stopping only ever signals the PIDs recorded in cluster.json, and only while their command
line still names this state directory (a PID reused by another process is left alone).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from holmes_dev.kubectl import run_kubectl

from . import container, imagepolicy, podnet

REPO = Path(__file__).resolve().parents[2]
CACHE_BIN = Path(os.environ.get("HOLMES_CACHE", Path.home() / ".cache" / "holmes")) / "bin"
# HOLMES_K8S_VERSION names another release than the one built into bin/ (the compatibility tier,
# `make compat`): its control plane and kubectl come from releases/<version>/, which
# `HOLMES_K8S_VERSION=<version> hack/build-k8s.sh` builds; etcd and the rest stay the default's.
K8S_VERSION = os.environ.get("HOLMES_K8S_VERSION", "")
RELEASE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# Port blocks: base+0 etcd client, base+1 etcd peer, base+2 apiserver, base+3 node agent's log server.
PORT_RANGE = (26400, 29990)
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "node-agent")
# the `kubernetes` Service's names, in the API server's certificate (ControlPlane._serving_cert)
API_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
# name prefixes of the processes that play nodes besides the agent: real nodes' and kwok
NODE_PROCESSES = ("kubelet-", "containerd-", "coredns", "kube-proxy", "dra-plugin-", "kwok")


class ClusterError(RuntimeError):
    """The cluster could not be started or used; the message says what to do."""


def built_version(name: str) -> str | None:
    """The release a hack/build-*.sh script recorded for ``name`` in bin/.versions (None: not built)."""
    try:
        lines = (CACHE_BIN / ".versions").read_text().splitlines()
    except OSError:
        return None
    return next((ln.split()[1] for ln in lines if len(ln.split()) == 2 and ln.split()[0] == name), None)


def binary(name: str) -> str:
    p = CACHE_BIN / name
    if K8S_VERSION and name in RELEASE_BINARIES and built_version(name) != K8S_VERSION:
        p = CACHE_BIN.parent / "releases" / K8S_VERSION / name
        if not os.access(p, os.X_OK):
            raise ClusterError(
                f"{p} is missing: HOLMES_K8S_VERSION={K8S_VERSION} asks for another release than the "
                f"one built; build it with `HOLMES_K8S_VERSION={K8S_VERSION} bash hack/build-k8s.sh` "
                f"(`make compat` does)"
            )
        return str(p)
    if not os.access(p, os.X_OK):
        raise ClusterError(
            f"{p} is missing: build the control plane first with `bash hack/build-k8s.sh` "
            f"(or `make test`/`make cluster-up`, which run it)"
        )
    return str(p)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_ports(requested: int | None) -> int:
    """A base port whose block of four is free. An explicit HOLMES_PORT_BASE must be free."""
    if requested:
        busy = [p for p in range(requested, requested + 4) if not port_free(p)]
        if busy:
            raise ClusterError(
                f"port(s) {busy} on 127.0.0.1 already in use; choose another "
                f"HOLMES_PORT_BASE or stop what listens there"
            )
        return requested
    rnd = random.Random()
    for _ in range(50):
        base = rnd.randrange(PORT_RANGE[0], PORT_RANGE[1], 10)
        if all(port_free(p) for p in range(base, base + 4)):
            return base
    raise ClusterError(f"no free block of 4 ports found in {PORT_RANGE}; set HOLMES_PORT_BASE")


def stop_pid(pid: int, grace: float, sig: int = signal.SIGTERM) -> None:
    """``sig``, then SIGKILL after ``grace`` seconds; reaped when it is our child."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace
    while pid_alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def mentions(pid: int, state_dir: Path) -> bool:
    """Whether process ``pid`` was started for ``state_dir``: every component's command line
    names a path in it (--data-dir, --cert-dir, --kubeconfig, --state-dir). A recorded PID that
    fails this was reused by another process after ours died (a killed session, a reboot)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    d = str(state_dir)
    values = (a.decode(errors="replace").split("=", 1)[-1] for a in args)
    return any(v == d or v.startswith(d + "/") for v in values)


def openssl(*args: str) -> None:
    """The openssl command (the test bed's certificates), its output kept unless it fails."""
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def self_signed(cn: str, key: Path, crt: Path) -> None:
    """A self-signed certificate for ten years, with a new RSA key."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", f"/CN={cn}",
            "-keyout", str(key), "-out", str(crt))  # fmt: skip


class ControlPlane:
    def __init__(self, state_dir: str | Path):
        self.dir = Path(state_dir).resolve()
        self.state_file = self.dir / "cluster.json"
        self.kubeconfig = self.dir / "kubeconfig"

    # ---- state ---------------------------------------------------------------------------
    def state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, st: dict) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(st, indent=2))
        tmp.replace(self.state_file)

    def running(self) -> bool:
        """True when every recorded component is alive and the apiserver answers /readyz."""
        st = self.state()
        pids = st.get("pids", {})
        nodes = [n for n in pids if n.startswith(NODE_PROCESSES)]  # realnode.py's, kwok
        if not pids or not all(self._alive(pids.get(c)) for c in (*COMPONENTS, *nodes)):
            return False
        return self._ready(st)

    def _alive(self, pid: int | None) -> bool:
        """``pid`` is alive and is one of this cluster's processes (not a reused PID)."""
        return pid_alive(pid) and mentions(pid, self.dir)

    def _ready(self, st: dict) -> bool:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        req = urllib.request.Request(
            f"https://{api_host(st)}:{st['apiserverPort']}/readyz",
            headers={"Authorization": f"Bearer {st['token']}"},
        )
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    # ---- start ---------------------------------------------------------------------------
    def up(self, topology: str | Path, port_base: int | None = None, log=print) -> dict:
        """Start everything (idempotent: a healthy cluster with the same topology is kept)."""
        topology = str(Path(topology).resolve())
        from .topology import KUBELET, load_topology

        topo = load_topology(topology)  # fail early on a bad file
        real = bool(topo.played_by(KUBELET).nodes)
        if self.running():
            st = self.state()
            if st.get("topology") == topology:
                log(f"cluster already running ({self.kubeconfig})")
                return st
            log(f"cluster running with another topology ({st.get('topology')}); restarting it")
        self.down(log=lambda *_: None)
        bins = {b: binary(b) for b in BINARIES}
        if real:
            from . import realnode

            try:
                realnode.preflight(CACHE_BIN)
            except realnode.RealNodeError as e:
                raise ClusterError(str(e)) from e
            bins.update({b: binary(b) for b in realnode.NODE_BINARIES})
        bins["kwok"] = binary("kwok")
        for tool in ("openssl", "unshare"):
            if not shutil.which(tool):
                raise ClusterError(
                    f"`{tool}` not found: apt-get install {'openssl' if tool == 'openssl' else 'util-linux'}"
                )
        try:
            podnet.preflight()
            ip_octet = podnet.pick_octet()
        except podnet.NetworkError as e:
            raise ClusterError(str(e)) from e
        # A fresh etcd each time: nothing of an earlier run survives, so neither do its pod dirs.
        shutil.rmtree(self.dir / "etcd", ignore_errors=True)
        shutil.rmtree(self.dir / "pods", ignore_errors=True)
        (self.dir / "powered-off").unlink(missing_ok=True)  # every node of a new cluster is on
        for sub in ("pki", "logs", "pods"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        base = pick_ports(port_base or int(os.environ.get("HOLMES_PORT_BASE", 0)) or None)
        st = {
            "portBase": base,
            "etcdPort": base,
            "apiserverPort": base + 2,
            "kubeletPort": base + 3,
            # The agent's own /24 of the pod subnet (and 127.<octet>.x.y for hostNetwork pods):
            # free on this machine, so two clusters' pods never clash; the agent locks it.
            "podIPOctet": ip_octet,
            "token": secrets.token_hex(16),
            "topology": topology,
            # Images whose pods run as host processes when not in the local containers storage
            # (imagepolicy.py): LOCALKUBE_HOST_IMAGES, comma-separated patterns; "" for none.
            "hostImages": list(imagepolicy.parse_patterns(os.environ.get("LOCALKUBE_HOST_IMAGES"))),
            "stateDir": str(self.dir),
            "realNodes": None,
            "pids": {},
        }
        self._save(st)
        pki = self.dir / "pki"
        (pki / "tokens.csv").write_text(f"{st['token']},admin,admin,system:masters\n")
        if not (pki / "sa.key").exists():
            subprocess.run(
                ["openssl", "genrsa", "-out", str(pki / "sa.key"), "2048"], check=True, capture_output=True
            )
            subprocess.run(
                ["openssl", "rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub")],
                check=True,
                capture_output=True,
            )
        if not (pki / "kubelet.key").exists():  # the node agent's log server (kubectl logs)
            self_signed("localkube-kubelet", pki / "kubelet.key", pki / "kubelet.crt")
        if real:
            self._kubelet_pki(pki)
        try:
            self._start_all(st, bins, log)
        except BaseException:
            self.down(log=lambda *_: None)
            raise
        return st

    def _spawn(
        self, st: dict, name: str, argv: list[str], env: dict | None = None, pass_fds: tuple[int, ...] = ()
    ) -> None:
        with open(self.dir / "logs" / f"{name}.log", "ab") as logf:
            # Own session: Ctrl-C in the terminal does not hit it; we stop it by its recorded PID.
            p = subprocess.Popen(
                argv,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.dir,
                env=env,
                pass_fds=pass_fds,
            )
        st["pids"][name] = p.pid
        self._save(st)

    def _wait(self, what: str, st: dict, name: str, ok, timeout: float, every: float = 0.2) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ok():
                return
            if not pid_alive(st["pids"].get(name)):
                tail = (self.dir / "logs" / f"{name}.log").read_text(errors="replace")[-2000:]
                raise ClusterError(f"{name} exited while starting; log tail:\n{tail}")
            time.sleep(every)
        raise ClusterError(
            f"timed out after {timeout:.0f}s waiting for {what}; see {self.dir / 'logs' / (name + '.log')}"
        )

    def _start_all(self, st: dict, bins: dict, log) -> None:
        d, pki, ep = self.dir, self.dir / "pki", st["etcdPort"]
        t0 = time.monotonic()
        from .topology import KUBELET, KWOK, load_topology

        topo = load_topology(st["topology"])
        real = None
        if topo.played_by(KUBELET).nodes:
            from .realnode import RealNodeError, RealNodes

            real = RealNodes(self, st, bins, log)
            try:
                # pods reach the API server through the `kubernetes` Service (kube-proxy): it
                # listens on a real node's bridge address, which must exist before it starts
                st["apiserverHost"] = real.claim(topo)
            except RealNodeError as e:
                raise ClusterError(str(e)) from e
            self._save(st)
            self._serving_cert(pki, st["apiserverHost"])
        host = api_host(st)
        log(f"starting etcd on 127.0.0.1:{ep}")
        self._spawn(
            st,
            "etcd",
            [
                bins["etcd"],
                "--name",
                "localkube",
                "--data-dir",
                str(d / "etcd"),
                "--listen-client-urls",
                f"http://127.0.0.1:{ep}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{ep}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{ep + 1}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{ep + 1}",
                "--initial-cluster",
                f"localkube=http://127.0.0.1:{ep + 1}",
                "--quota-backend-bytes",
                str(2 << 30),
                "--log-level",
                "warn",
            ],
        )
        self._wait("etcd", st, "etcd", lambda: not port_free(ep), 30)

        ap = st["apiserverPort"]
        log(f"starting kube-apiserver on https://{host}:{ap}")
        self._spawn(
            st,
            "kube-apiserver",
            [
                bins["kube-apiserver"],
                f"--etcd-servers=http://127.0.0.1:{ep}",
                f"--bind-address={host}",
                f"--advertise-address={host}",
                f"--secure-port={ap}",
                f"--cert-dir={pki}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.96.0.0/16",
                # the `kubernetes` Service's endpoint is the advertised address: a loopback one
                # may not be an endpoint, so only a cluster with real nodes (kube-proxy) has it
                f"--endpoint-reconciler-type={'lease' if real else 'none'}",
                "--enable-priority-and-fairness=false",
                "--kubelet-preferred-address-types=InternalIP",
                # No kube-proxy here: the API server resolves a webhook's Service to its endpoints
                # itself (Kueue's webhooks, hack/localkube/kueue.py).
                "--enable-aggregator-routing=true",
                "--profiling=false",
                "--v=1",
                # ours (with 127.0.0.1 beside the bridge address) when the API server is not on
                # loopback: the node agent's pods reach it through a relay on their 127.0.0.1
                *(
                    [
                        f"--tls-cert-file={pki / 'apiserver.crt'}",
                        f"--tls-private-key-file={pki / 'apiserver.key'}",
                    ]
                    if real
                    else []
                ),
                # real nodes' kubelets trust this client certificate (logs, exec; realnode.py)
                *(
                    [
                        f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
                        f"--kubelet-client-key={pki / 'kubelet-client.key'}",
                    ]
                    if (pki / "kubelet-client.crt").exists()
                    else []
                ),
            ],
        )
        self._wait("kube-apiserver /readyz", st, "kube-apiserver", lambda: self._ready(st), 90)
        self._write_kubeconfig(st)

        common = [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--profiling=false"]
        log("starting kube-controller-manager and kube-scheduler")
        self._spawn(
            st,
            "kube-controller-manager",
            [
                bins["kube-controller-manager"],
                *common,
                "--secure-port=0",
                # The node lifecycle controller runs, as on any cluster: a node whose heartbeats
                # stop (the agent's status, a kubelet's or kwok's Lease) goes Unknown, is tainted
                # unreachable and its pods evicted once they stop tolerating it.
                "--controllers=*,-csrsigning,-csrapproving,-csrcleaner,-bootstrapsigner,-tokencleaner",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'apiserver.crt'}",
                "--concurrent-gc-syncs=5",
                "--cluster-cidr=10.244.0.0/16",
                "--allocate-node-cidrs=false",
            ],
        )
        self._spawn(st, "kube-scheduler", [bins["kube-scheduler"], *common, "--secure-port=0"])

        log("starting the node agent")
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PYTHONUNBUFFERED": "1"}
        self._spawn(
            st, "node-agent", [sys.executable, "-m", "localkube", "--state-dir", str(d), "agent"], env=env
        )
        self._start_kwok(st, bins["kwok"], topo.played_by(KWOK), log)
        if real is not None:
            from .realnode import RealNodeError

            try:
                real.start(topo)
            except RealNodeError as e:
                raise ClusterError(str(e)) from e
        names = set(topo.names)
        self._wait(
            "the node agent to register Ready nodes",
            st,
            "node-agent",
            lambda: names <= self._ready_nodes(),
            60,
        )
        self._wait(
            "the default service account",
            st,
            "kube-controller-manager",
            lambda: self._kubectl_ok("get", "serviceaccount", "default", "-n", "default"),
            60,
        )
        log(f"cluster up in {time.monotonic() - t0:.1f}s: {len(names)} nodes; kubeconfig {self.kubeconfig}")

    def _start_kwok(self, st: dict, kwok_bin: str, hollow, log) -> None:
        """The cluster's one kwok process (its config and Holmes' Stages in kwok.yaml, paced by
        the topology's ``kwok`` mapping), then its nodes registered (kwok first: it takes each
        node up as it is registered), until every one is Ready. Started with none too: a node
        registered later for it (hollow.register) is played as a topology's, so a test that only
        needs nodes gets ones that heartbeat and report their pods as kubelets do."""
        from kubernetes import client

        from . import hollow as hl
        from . import hollow_nodes as hn

        k = hollow.kwok
        cfg = self.dir / "kwok.yaml"
        try:
            cfg.write_text(hn.kwok_config(k.start_seconds, k.status_seconds, k.parallelism))
        except hn.HollowError as e:
            raise ClusterError(f"{hollow.path}: kwok: {e}") from e
        log(f"starting kwok for {len(hollow.nodes)} hollow nodes")
        t0 = time.monotonic()
        self._spawn(st, "kwok", hl.kwok_command(str(self.kubeconfig), str(cfg), k.lease_seconds, kwok_bin))
        api = hl.api_client(str(self.kubeconfig))
        try:
            hl.register(client.CoreV1Api(api), [hn.node_body(n) for n in hollow.nodes])
        finally:
            api.close()
        names = set(hollow.names)
        self._wait(
            f"kwok to take its {len(names)} nodes Ready",
            st,
            "kwok",
            lambda: names <= self._ready_nodes(),
            60 + len(names) / 4,
            every=0.2 if len(names) < 200 else 1.0,  # each look lists every node
        )
        # what the scale bench reports as its nodes' readiness (nodesReadyS)
        st["kwok"] = {"nodes": len(names), "readyS": round(time.monotonic() - t0, 1)}
        self._save(st)
        log(f"{len(names)} kwok nodes Ready {st['kwok']['readyS']}s after kwok started")

    # ---- faults (bench/control_plane_faults.py) --------------------------------------------
    def pid(self, name: str) -> int:
        pid = self.state().get("pids", {}).get(name)
        if not self._alive(pid):
            raise ClusterError(f"{name} is not running (state {self.state_file})")
        return pid

    def pause(self, name: str) -> None:
        """SIGSTOP one component (a stalled process: its sockets stay open, nothing answers)."""
        os.kill(self.pid(name), signal.SIGSTOP)

    def resume(self, name: str) -> None:
        os.kill(self.pid(name), signal.SIGCONT)

    def restart(
        self, name: str, sig: int = signal.SIGTERM, down_for: float = 0.0, timeout: float = 90
    ) -> float:
        """Stop one component with ``sig`` (SIGKILL: a crash), wait ``down_for`` seconds, start it
        again with the same command line and environment, and wait until it serves; the seconds
        it was down. A node agent killed takes its pods' processes with it (a node reboot)."""
        st = self.state()
        pid = self.pid(name)
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        env = dict(
            kv.split(b"=", 1) for kv in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in kv
        )
        t0 = time.monotonic()
        stop_pid(pid, 15, sig)
        if name == "node-agent":
            from .agent import kill_recorded_pods

            kill_recorded_pods(self.dir)
        # A multi-threaded process's leader shows as a zombie before its last thread has closed the
        # files they share: its listening port can stay bound a moment longer, and the new one
        # would exit on "bind: address already in use" (seen in CI after a crashed API server).
        ports = _listening_ports(st, name)
        end = time.monotonic() + 15
        while not all(port_free(p) for p in ports):
            if time.monotonic() > end:
                raise ClusterError(f"{name}'s port(s) {ports} still in use 15s after it stopped")
            time.sleep(0.05)
        time.sleep(down_for)
        self._spawn(
            st,
            name,
            [a.decode() for a in argv],
            env={k.decode(): v.decode() for k, v in env.items()},
        )
        ready = {
            "etcd": lambda: not port_free(st["etcdPort"]),
            "kube-apiserver": lambda: self._ready(st),
            "node-agent": lambda: set(_names(st)) <= self._ready_nodes(),
        }.get(name, lambda: True)
        self._wait(f"{name} to serve again", st, name, ready, timeout)
        return time.monotonic() - t0

    def _kubectl_ok(self, *args: str) -> bool:
        return run_kubectl(binary("kubectl"), str(self.kubeconfig), *args).returncode == 0

    def _ready_nodes(self) -> set[str]:
        r = subprocess.run(
            [
                binary("kubectl"),
                f"--kubeconfig={self.kubeconfig}",
                "get",
                "nodes",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name}="
                '{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}',
            ],
            capture_output=True,
            text=True,
        )
        return {ln.split("=")[0] for ln in r.stdout.split() if ln.endswith("=True")}

    @staticmethod
    def _kubelet_pki(pki: Path) -> None:
        """A CA the real nodes' kubelets trust for client certificates, and the API server's
        certificate from it (system:masters: the kubelets' webhook authorization allows it)."""
        if (pki / "kubelet-client.crt").exists():
            return

        ca, key = str(pki / "kubelet-ca.crt"), str(pki / "kubelet-ca.key")
        self_signed("localkube-kubelet-ca", Path(key), Path(ca))
        openssl(
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/O=system:masters/CN=kube-apiserver-kubelet-client",
            "-keyout",
            str(pki / "kubelet-client.key"),
            "-out",
            str(pki / "kubelet-client.csr"),
        )
        openssl(
            "x509",
            "-req",
            "-in",
            str(pki / "kubelet-client.csr"),
            "-CA",
            ca,
            "-CAkey",
            key,
            "-CAcreateserial",
            "-days",
            "3650",
            "-out",
            str(pki / "kubelet-client.crt"),
        )

    @staticmethod
    def _serving_cert(pki: Path, host: str) -> None:
        """The API server's serving certificate, made anew by a CA of its own (both in
        ``apiserver.crt``, as the API server writes its self-signed one): valid for ``host``,
        127.0.0.1, the `kubernetes` Service's ClusterIP and its names."""
        san = ",".join(
            [f"IP:{ip}" for ip in (host, "127.0.0.1", "10.96.0.1")] + [f"DNS:{n}" for n in API_NAMES]
        )
        ca_key, ca = pki / "apiserver-ca.key", pki / "apiserver-ca.crt"
        self_signed("localkube-apiserver-ca", ca_key, ca)
        openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={host}",
                "-addext", f"subjectAltName={san}", "-keyout", str(pki / "apiserver.key"),
                "-out", str(pki / "apiserver.csr"))  # fmt: skip
        openssl("x509", "-req", "-in", str(pki / "apiserver.csr"), "-CA", str(ca), "-CAkey", str(ca_key),
                "-CAcreateserial", "-days", "3650", "-copy_extensions", "copy",
                "-out", str(pki / "apiserver.leaf.crt"))  # fmt: skip
        (pki / "apiserver.crt").write_bytes((pki / "apiserver.leaf.crt").read_bytes() + ca.read_bytes())

    def _write_kubeconfig(self, st: dict) -> None:
        import base64

        ca = base64.b64encode((self.dir / "pki" / "apiserver.crt").read_bytes()).decode()
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "localkube",
            "clusters": [
                {
                    "name": "localkube",
                    "cluster": {
                        "server": f"https://{api_host(st)}:{st['apiserverPort']}",
                        "certificate-authority-data": ca,
                    },
                }
            ],
            "users": [{"name": "admin", "user": {"token": st["token"]}}],
            "contexts": [{"name": "localkube", "context": {"cluster": "localkube", "user": "admin"}}],
        }
        self.kubeconfig.write_text(json.dumps(cfg, indent=2))
        self.kubeconfig.chmod(0o600)

    # ---- stop ----------------------------------------------------------------------------
    def down(self, log=print, grace: float = 10.0) -> None:
        """Stop the recorded processes: add-ons (Kueue, JobSet, Kubeflow Trainer: kueue.py, jobset.py,
        kftrainer.py) first, then the node agent (it stops its pods), etcd last."""
        st = self.state()
        if st.get("realNodes"):  # kubelets, containerds, CoreDNS, and what they leave
            from .realnode import stop as stop_real_nodes

            stop_real_nodes(self, st, log, grace)
        pids = st.get("pids", {})
        for name in [n for n in pids if n not in COMPONENTS] + list(reversed(COMPONENTS)):
            pid = pids.get(name)
            if not self._alive(pid):
                continue
            log(f"stopping {name} (pid {pid})")
            stop_pid(pid, grace)
        # Pod process groups the agent recorded, in case the agent itself died uncleanly.
        from .agent import container_prefix, kill_recorded_pods

        kill_recorded_pods(self.dir)
        octet = st.get("podIPOctet")
        podnet.release_leftovers(
            self.dir, octet, also=lambda: container.remove_leftovers(container_prefix(octet))
        )
        if pids:
            st["pids"] = {}
            st.pop("kueue", None)
            st.pop("jobset", None)
            st.pop("kftrainer", None)
            st.pop("kwok", None)
            self._save(st)


def api_host(st: dict) -> str:
    """Where the API server listens: loopback, or a real node's bridge address (realnode.py)."""
    return st.get("apiserverHost") or "127.0.0.1"


def _listening_ports(st: dict, name: str) -> list[int]:
    """The ports ``name`` listens on (the others run with --port=0/--secure-port=0)."""
    if name == "etcd":
        return [st["etcdPort"], st["etcdPort"] + 1]
    if name == "kube-apiserver":
        return [st["apiserverPort"]]
    return []


def _names(st: dict) -> list[str]:
    from .topology import load_topology

    return list(load_topology(st["topology"]).names)
