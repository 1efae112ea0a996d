"""Fault soak: a checkpointing HolmesJob on the local cluster while faults strike at random times.

First the job runs undisturbed (the reference; with --reference process in one trainer process
on this machine instead of the job's pods: the same loss, since the trainer matches a
single-process run under any layout); then the same job runs again while faults are
injected, one at a time, each at a random moment once the job has recovered from the last:

    kill-trainer   kill -9 one trainer process (a crash: counts against backoffLimit)
    kill-checkpointer  kill -9 one rank's checkpoint process (what the OOM killer would pick):
                   its rank stops, and the job restarts as after a crash
    delete-pod     kubectl delete pod (graceful: the trainer may save, then exits 83)
    drain-node     cordon + drain a node of the job (eviction); uncordoned once the job recovered
    delete-node    a node's machine goes dark, then its Node is deleted; back once recovered
    kill-operator  kill -9 the operator; started again 2 s later

The job is elastic (nodes.minCount below count), so losing a node shrinks it at once and it grows
back after its next checkpoint. Reported per fault kind: time to recover (the fault -> the next
iteration trained after it) and iterations lost (trained before the fault, trained again after
it); overall goodput (iterations that count / iterations trained). Checked: the job Succeeds, its
final loss is within 1e-3 of the reference, every attempt resumes after the newest checkpoint
that had committed, no fault loses more iterations than the checkpoint interval and the save in
flight (MOST_LOST), no two live pods of one rank, no two attempts' pods alive at once, nothing
left behind.

    .venv/bin/python bench/fault_soak.py                       # private cluster, 10 faults
    .venv/bin/python bench/fault_soak.py --faults 3 --kinds delete-pod,delete-node,kill-trainer
    HOLMES_KUBECONFIG=.holmes/pytest-123/kubeconfig .venv/bin/python bench/fault_soak.py ...

Exit 0 when every check holds, 1 otherwise. Needs root (the node agent's or the real kubelet
nodes' processes are killed) and the built cluster. On real nodes (HOLMES_E2E_TOPOLOGY) a
machine going dark is its kubelet, containerd and pods killed (localkube's ``power``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "hack"), str(REPO / "bench")]  # the localkube harness, bench helpers

from holmes_dev.jobs import holmes_job  # noqa: E402
from holmes_dev.kubectl import run_kubectl  # noqa: E402
from operator_apply import cluster_kubeconfig, stop_cluster  # noqa: E402

from localkube.__main__ import set_power  # noqa: E402
from localkube.controlplane import ControlPlane, binary  # noqa: E402
from localkube.operatorproc import OperatorProcess, install_crd  # noqa: E402

KINDS = ("kill-trainer", "kill-checkpointer", "delete-pod", "drain-node", "delete-node", "kill-operator")
CHECKPOINT_INTERVAL = 10
# Checkpoints are saved asynchronously (training.checkpoint.asynchronous, the default): the one
# started at iteration N counts only once every rank has written it, and a crash before that
# resumes from the one before. Two checks: the next attempt resumes from the newest checkpoint
# that had committed (nothing written is lost), and, since one save at most is in flight (the
# next waits for it), a fault loses less than two intervals. How long a save takes is the
# machine's: a checkpoint process starved of CPU (2 shared cores, niced) wrote one in 6+
# iterations, where a fixed "interval + 2" bound failed a correct run.
MOST_LOST = 2 * CHECKPOINT_INTERVAL - 1
LOSS_TOLERANCE = 1e-3
POD_MARKER = "LOCALKUBE_POD"


def job_manifest(name: str, ns: str, ckpt: Path, iterations: int) -> dict:
    """The demo's model on all six nodes in two pipeline stages (2x3; 2x2 on four nodes, so a
    lost node changes the layout), elastic down to four, checkpointing every CHECKPOINT_INTERVAL
    iterations onto a directory every simulated node shares."""
    return holmes_job(
        name,
        {
            "model": {"layers": 6, "hiddenSize": 64, "attentionHeads": 4, "seqLength": 32, "vocabSize": 256},
            "training": {
                "globalBatchSize": 12,
                "microBatchSize": 2,
                "iterations": iterations,
                "learningRate": 1.0e-3,
                "activationRecompute": False,
                "data": {"synthetic": {}},
                "checkpoint": {"path": "/ckpt", "intervalIterations": CHECKPOINT_INTERVAL},
            },
            # no re-plan from measured speeds: a relaunch of its own would land among the faults
            # (bench/replan_closed_loop.py measures re-planning)
            "parallelism": {"pipeline": 2, "replan": {"enabled": False}},
            "nodes": {"count": 6, "gpusPerNode": 1, "minCount": 4},
            "runPolicy": {"backoffLimit": 20, "waitForNodesSeconds": 0},
            "template": {
                "spec": {
                    "terminationGracePeriodSeconds": 20,
                    "containers": [
                        {
                            "name": "trainer",
                            # rank 0's metric lines, a file per attempt (metric_lines)
                            "args": ["--metrics-file", "/ckpt/metrics-$(HOLMES_ATTEMPT).jsonl"],
                            "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
                        }
                    ],
                    "volumes": [{"name": "ckpt", "hostPath": {"path": str(ckpt)}}],
                }
            },
        },
        ns,
    )


class Cluster:
    def __init__(self, kubeconfig: str, state_dir: Path):
        self.kubeconfig, self.state_dir = kubeconfig, state_dir
        self.kubectl_bin = binary("kubectl")

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120, input: str | None = None) -> str:
        r = run_kubectl(self.kubectl_bin, self.kubeconfig, *args, input=input, timeout=timeout)
        if check and r.returncode:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout

    def get(self, *args: str) -> dict | None:
        out = self.kubectl("get", *args, "-o", "json", check=False)
        return json.loads(out) if out.strip() else None

    def pods(self, ns: str, job: str) -> list[dict]:
        return (self.get("pods", "-n", ns, "-l", f"holmes.dev/job-name={job}") or {}).get("items", [])

    def power(self, node: str, on: bool) -> None:
        set_power(ControlPlane(self.state_dir), node, on)

    def real_node_cgroups(self) -> list[str]:
        """The cgroup names of the cluster's real nodes (the kubelets' cgroupRoot), if any."""
        from localkube.realnode import node_cgroup

        st = ControlPlane(self.state_dir).state().get("realNodes") or {}
        return [node_cgroup(octet, name) for name, octet in (st.get("octets") or {}).items()]


# ---- watching the job ---------------------------------------------------------------------------


@dataclass
class Timeline:
    """What a poller saw: (time, iteration) as rank 0 of each attempt logged it, and violations."""

    iterations: list[tuple[float, int, int]] = field(default_factory=list)  # (t, attempt, iteration)
    commits: list[tuple[float, int, int]] = field(default_factory=list)  # checkpoints committed
    problems: list[str] = field(default_factory=list)
    seen: set = field(default_factory=set)


class Watcher(threading.Thread):
    def __init__(self, c: Cluster, ns: str, job: str, ckpt: Path, every: float = 0.3):
        super().__init__(daemon=True)
        self.c, self.ns, self.job, self.ckpt, self.every = c, ns, job, ckpt, every
        self.t = Timeline()
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.poll()
            except Exception as e:  # a transient API error must not end the watch
                print(f"   (watch: {e})", file=sys.stderr)
            self.stop.wait(self.every)

    def poll(self) -> None:
        pods = self.c.pods(self.ns, self.job)
        live = [
            p
            for p in pods
            if p["status"].get("phase") in ("Pending", "Running")
            and not p["metadata"].get("deletionTimestamp")
        ]
        ranks = defaultdict(list)
        for p in live:
            lab = p["metadata"]["labels"]
            ranks[(lab["holmes.dev/attempt"], lab["holmes.dev/node-rank"])].append(p["metadata"]["name"])
        attempts = {a for a, _ in ranks}
        with self.lock:
            for key, names in ranks.items():
                if len(names) > 1:
                    self.t.problems.append(f"duplicate pods for attempt/rank {key}: {names}")
            running = {
                p["metadata"]["labels"]["holmes.dev/attempt"]
                for p in live
                if p["status"].get("phase") == "Running"
            }
            if len(running) > 1:
                self.t.problems.append(f"pods of attempts {sorted(running)} running at once")
            del attempts
            for attempt in sorted({int(p["metadata"]["labels"]["holmes.dev/attempt"]) for p in pods}):
                for rec in metric_lines(self.ckpt, attempt):
                    kind = rec.get("holmes")
                    key = (kind, attempt, rec.get("iteration"))
                    if kind in ("iteration", "checkpoint") and key not in self.t.seen:
                        self.t.seen.add(key)
                        into = self.t.iterations if kind == "iteration" else self.t.commits
                        into.append((time.monotonic(), attempt, rec["iteration"]))

    def committed(self, up_to_attempt: int) -> int:
        """The newest checkpoint rank 0 saw committed in an attempt up to ``up_to_attempt``."""
        with self.lock:
            return max((it for _, a, it in self.t.commits if a <= up_to_attempt), default=0)

    def last(self) -> tuple[float, int, int] | None:
        with self.lock:
            return max(self.t.iterations, default=None, key=lambda x: (x[0], x[2]))

    def first_after(self, t0: float, attempt_above: int) -> tuple[float, int, int] | None:
        """The first iteration logged after ``t0`` by an attempt newer than ``attempt_above``."""
        with self.lock:
            return min((x for x in self.t.iterations if x[0] > t0 and x[1] > attempt_above), default=None)


def ended(c: Cluster, ns: str, name: str) -> bool:
    return job_status(c, ns, name).get("phase") in ("Succeeded", "Failed")


def started(c: Cluster, ns: str, name: str, w: Watcher) -> bool:
    """Whether training began; raises when the operator stalled the job (bad spec, policy)."""
    st = job_status(c, ns, name)
    stalled = next((x for x in st.get("conditions") or [] if x["type"] == "Stalled"), {})
    if stalled.get("status") == "True":
        raise RuntimeError(f"the operator stalled the job: {stalled.get('message')}")
    return (w.last() or (0, 0, 0))[2] >= 2


def stable(c: Cluster, ns: str, name: str, w: Watcher, timeout: float) -> None:
    """Wait until the job runs at its full size and trains in its current attempt."""

    def ok() -> bool:
        st = job_status(c, ns, name)
        if st.get("phase") in ("Succeeded", "Failed") and (st.get("size") or {}).get("current") != (
            st.get("size") or {}
        ).get("desired"):
            raise RuntimeError(f"the job ended {st.get('phase')} below its full size: {st.get('size')}")
        size = st.get("size") or {}
        last = w.last()
        return (
            st.get("phase") in ("Running", "Succeeded", "Failed")
            and size.get("current") == size.get("desired")
            and last is not None
            and last[1] == st.get("attempt")
        )

    wait_until("the job to run at full size", ok, timeout)


def job_status(c: Cluster, ns: str, name: str) -> dict:
    return (c.get("holmesjob", name, "-n", ns) or {}).get("status") or {}


def wait_until(what: str, fn, timeout: float, every: float = 0.5):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


# ---- faults -------------------------------------------------------------------------------------


def shared_dir(path: Path) -> None:
    """A job's checkpoint directory, which its trainers write as whatever user the pod runs as
    (a real node's containers as the image's non-root user)."""
    path.mkdir()
    path.chmod(0o777)


def metric_lines(ckpt: Path, attempt: int) -> list[dict]:
    """Rank 0's JSON metric lines of one attempt (job_manifest's --metrics-file)."""
    out = []
    try:
        text = (ckpt / f"metrics-{attempt}.jsonl").read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            pass
    return out


def pod_processes(c: Cluster, ns: str, pod_prefix: str) -> list[tuple[int, list[bytes], str]]:
    """(pid, environment entries, pod name) of the processes of pods whose name starts with
    ``pod_prefix``: those the node agent runs (it marks each with LOCALKUBE_POD=<state
    dir>:<namespace>/<pod>) and those in the pods' cgroups on the cluster's real nodes (the
    namespace is this bench's own; HOSTNAME is the pod's name, which is its hostname)."""
    real = c.real_node_cgroups()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            cgroup = (d / "cgroup").read_text() if real else ""
        except OSError:
            continue
        mark = next((e for e in env if e.startswith(f"{POD_MARKER}=".encode())), None)
        where = mark.decode(errors="replace").rsplit(":", 1)[-1] if mark else ""
        if where.startswith(f"{ns}/{pod_prefix}"):
            out.append((int(d.name), env, where.split("/", 1)[1]))
        elif real and any(f":/{g}/kubepods/" in cgroup for g in real):
            host = next((e[9:].decode() for e in env if e.startswith(b"HOSTNAME=")), "")
            if host.startswith(pod_prefix):
                out.append((int(d.name), env, host))
    return out


def trainer_pids(c: Cluster, ns: str, pod: str, checkpointer: bool = False) -> list[int]:
    """The pod's trainer workers (torchrun gives only them a LOCAL_RANK), or with
    ``checkpointer`` their checkpoint processes (spawned by a worker: its environment, and
    multiprocessing's command line; before, a killed "trainer" was one of those at random)."""
    out = []
    for pid, env, name in pod_processes(c, ns, pod):
        if name != pod or not any(e.startswith(b"LOCAL_RANK=") for e in env):
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        spawned = b"multiprocessing" in cmd
        if (spawned and b"spawn_main" in cmd) if checkpointer else (b"holmes.trainer" in cmd and not spawned):
            out.append(pid)
    return out


class Faults:
    def __init__(self, c: Cluster, ns: str, job: str, op: OperatorProcess, rng: random.Random):
        self.c, self.ns, self.job, self.op, self.rng = c, ns, job, op, rng
        self.undo: list = []  # what to restore once the job has recovered

    def running_pods(self) -> list[dict]:
        st = job_status(self.c, self.ns, self.job)
        return [
            p
            for p in self.c.pods(self.ns, self.job)
            if p["metadata"]["labels"]["holmes.dev/attempt"] == str(st.get("attempt"))
            and p["status"].get("phase") == "Running"
        ]

    def strike(self, kind: str) -> str:
        pods = self.running_pods()
        if not pods:
            st = job_status(self.c, self.ns, self.job)
            raise RuntimeError(
                f"no running pod of attempt {st.get('attempt')} to strike (phase {st.get('phase')})"
            )
        victim = self.rng.choice(pods)
        name, node = victim["metadata"]["name"], victim["spec"]["nodeName"]
        if kind == "kill-trainer":
            pids = trainer_pids(self.c, self.ns, name)
            if not pids:
                raise RuntimeError(f"no trainer process found for pod {name}")
            os.kill(self.rng.choice(pids), signal.SIGKILL)
            return f"kill -9 a trainer of {name}"
        if kind == "kill-checkpointer":
            pids = trainer_pids(self.c, self.ns, name, checkpointer=True)
            if not pids:
                raise RuntimeError(f"no checkpoint process found for pod {name} (asynchronous saves off?)")
            os.kill(self.rng.choice(pids), signal.SIGKILL)
            return f"kill -9 a checkpoint process of {name}"
        if kind == "delete-pod":
            self.c.kubectl("delete", "pod", name, "-n", self.ns, "--wait=false")
            return f"delete pod {name}"
        if kind == "drain-node":
            self.c.kubectl("cordon", node)
            subprocess.Popen(  # drain waits for the evicted pod to stop: let it run on
                [
                    self.c.kubectl_bin,
                    f"--kubeconfig={self.c.kubeconfig}",
                    "drain",
                    node,
                    "--ignore-daemonsets",
                    "--delete-emptydir-data",
                    "--force",
                    "--timeout=120s",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.undo.append(lambda: self.c.kubectl("uncordon", node))
            return f"cordon and drain {node} (pod {name})"
        if kind == "delete-node":  # the machine dies first; then its Node goes, as a cloud would
            self.c.power(node, on=False)
            time.sleep(1.0)
            self.c.kubectl("delete", "node", node, "--wait=false")
            self.undo.append(lambda: self.c.power(node, on=True))
            return f"power off node {node} and delete it (pod {name})"
        if kind == "kill-operator":
            self.op.kill()
            time.sleep(2)
            self.op.start()
            return "kill -9 the operator (started again 2 s later)"
        raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(KINDS)}")

    def restore(self) -> None:
        for fn in self.undo:
            fn()
        self.undo.clear()


# ---- one run ------------------------------------------------------------------------------------


@dataclass
class Result:
    loss: float | None
    status: dict
    rank0: dict[int, list[dict]]  # attempt -> rank-0 metric lines
    faults: list[dict]
    problems: list[str]
    seconds: float


def apply(c: Cluster, obj: dict) -> None:
    c.kubectl("apply", "-f", "-", input=json.dumps(obj))


def rank0_lines(ckpt: Path, attempts: int) -> dict[int, list[dict]]:
    return {a: metric_lines(ckpt, a) for a in range(1, attempts + 1)}


def run_job(
    c: Cluster,
    ns: str,
    name: str,
    ckpt: Path,
    iterations: int,
    timeout: float,
    faults: list[str] = (),
    op: OperatorProcess | None = None,
    rng: random.Random | None = None,
) -> Result:
    t0 = time.monotonic()
    apply(c, job_manifest(name, ns, ckpt, iterations))
    w = Watcher(c, ns, name, ckpt)
    w.start()
    done: list[dict] = []
    inject = Faults(c, ns, name, op, rng or random.Random(0)) if faults else None
    left = lambda: timeout - (time.monotonic() - t0)  # noqa: E731
    try:
        wait_until("the first iterations", lambda: started(c, ns, name, w), left())
        # each fault at a random iteration of its own stretch of the run
        seg = (iterations - 2 * CHECKPOINT_INTERVAL) // max(len(faults), 1)
        targets = [
            CHECKPOINT_INTERVAL + i * seg + rng.randrange(max(seg // 2, 1)) for i in range(len(faults))
        ]
        for i, kind in enumerate(faults):
            stable(c, ns, name, w, left())  # full size again (a lost node back), training
            wait_until(
                f"iteration {targets[i]} for fault {i + 1}",
                lambda i=i: (w.last() or (0, 0, 0))[2] >= targets[i] or ended(c, ns, name),
                left(),
                every=0.2,
            )
            before = w.last()
            if ended(c, ns, name) or before[2] >= iterations - 2:
                raise RuntimeError(f"the job ended before fault {i + 1}: give it more iterations")
            what = inject.strike(kind)
            at = time.monotonic()
            print(f"   fault {i + 1}/{len(faults)} at iteration {before[2]}: {what}", flush=True)
            if kind == "kill-operator":  # training goes on; recovered once the operator is live
                nxt = (time.monotonic(), before[1], before[2])
            else:  # recovered at the first iteration of the next attempt
                nxt = wait_until(
                    f"training to resume after {kind}",
                    lambda at=at, attempt=before[1]: w.first_after(at, attempt),
                    left(),
                )
            inject.restore()
            # iterations lost: trained before the fault and trained again after it
            last_before = max((it for _, a, it in w.t.iterations if a == before[1]), default=0)
            lost = max(0, last_before - nxt[2] + 1) if nxt[1] != before[1] else 0
            done.append(
                {
                    "kind": kind,
                    "what": what,
                    "recoverSeconds": round(nxt[0] - at, 1),
                    "iterationsLost": lost,
                    "resumedAt": nxt[2],
                    # the newest checkpoint committed before the next attempt: it resumes after it
                    "committedBefore": w.committed(before[1]) if nxt[1] != before[1] else None,
                    "attempt": nxt[1],
                }
            )
            print(
                f"     recovered in {nxt[0] - at:.1f}s, attempt {nxt[1]}, lost {lost} iteration(s)",
                flush=True,
            )
        wait_until(
            "the job to finish",
            lambda: job_status(c, ns, name).get("phase") in ("Succeeded", "Failed"),
            left(),
        )
    finally:
        w.stop.set()
        w.join()
        if inject:
            inject.restore()
    st = job_status(c, ns, name)
    return Result(
        loss=(st.get("progress") or {}).get("loss"),
        status=st,
        rank0=rank0_lines(ckpt, int(st.get("attempt") or 1)),
        faults=done,
        problems=w.t.problems,
        seconds=time.monotonic() - t0,
    )


def run_reference_process(name: str, ns: str, ckpt: Path, iterations: int, timeout: float) -> Result:
    """The reference as one trainer process (torchrun, one rank, the whole model on it) instead of
    the job's six pods: the trainer trains the same numbers under any layout (its tests check
    every layout against a single-process loop), so the loss to match is the same, without five
    more processes importing torch and the pods' scheduling."""
    import yaml
    from holmes_dev.ports import free_port
    from trainer_common import layout

    t0 = time.monotonic()
    job = job_manifest(name, ns, ckpt, iterations)
    t, layers = job["spec"]["training"], job["spec"]["model"]["layers"]
    mb = t["microBatchSize"]
    one = layout(1, 1, [layers], mb, t["globalBatchSize"] // mb)  # pipeline 1, data 1: one rank
    (ckpt / "job.yaml").write_text(yaml.safe_dump(job))
    (ckpt / "layout.json").write_text(one.to_json())
    metrics = ckpt / "metrics.jsonl"
    cmd = [
        sys.executable, "-m", "holmes.trainer.run", "--nnodes=1", "--nproc-per-node=1", "--node-rank=0",
        "--rdzv-backend=static", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
        "-m", "holmes.trainer", "--job", str(ckpt / "job.yaml"), "--layout", str(ckpt / "layout.json"),
        "--metrics-file", str(metrics), "--checkpoint-dir", str(ckpt / "checkpoints"),
    ]  # fmt: skip
    # one thread, as a pod's process on its share of the cores: the same math, no threads spinning
    env = {**os.environ, "HOLMES_BACKEND": "gloo", "HOLMES_DTYPE": "float32", "HOLMES_TERMINATION_LOG": ""}
    env.setdefault("OMP_NUM_THREADS", "1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    text = metrics.read_text() if metrics.exists() else ""
    lines = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
    done = next((r for r in reversed(lines) if r.get("holmes") == "done"), None)
    if p.returncode or done is None:
        raise RuntimeError(f"the one-process reference exited {p.returncode}: {p.stderr[-2000:]}")
    status = {"phase": "Succeeded", "oneProcess": True}
    return Result(done.get("loss"), status, {1: lines}, [], [], time.monotonic() - t0)


def leftovers(c: Cluster, ns: str, job: str, final_attempt: int) -> list[str]:
    """Pods of earlier attempts still there, and pod processes of the namespace still alive."""
    out = [
        f"pod {p['metadata']['name']} of attempt {p['metadata']['labels']['holmes.dev/attempt']} left behind"
        for p in c.pods(ns, job)
        if p["metadata"]["labels"]["holmes.dev/attempt"] != str(final_attempt)
    ]
    out += [f"process {pid} of pod {name} still alive" for pid, _, name in pod_processes(c, ns, f"{job}-")]
    return out


def sizes(rank0: dict[int, list[dict]]) -> list[int]:
    """The world size of each attempt that started training (its rank 0's start line)."""
    return [
        next(r["worldSize"] for r in lines if r.get("holmes") == "start")
        for _, lines in sorted(rank0.items())
        if any(r.get("holmes") == "start" for r in lines)
    ]


def trained(rank0: dict[int, list[dict]]) -> int:
    """Iterations trained in every attempt together (rank 0's iteration lines)."""
    return sum(
        len({r["iteration"] for r in lines if r.get("holmes") == "iteration"}) for lines in rank0.values()
    )


def report(ref: Result, soak: Result, iterations: int, left: list[str]) -> bool:
    by = defaultdict(list)
    for f in soak.faults:
        by[f["kind"]].append(f)
    print()
    print(f"{'fault':<18}{'count':>6}{'recover s (mean/max)':>24}{'iterations lost (mean/max)':>30}")
    for kind in KINDS:
        fs = by.get(kind)
        if not fs:
            continue
        rec = [f["recoverSeconds"] for f in fs]
        lost = [f["iterationsLost"] for f in fs]
        print(
            f"{kind:<18}{len(fs):>6}{sum(rec) / len(rec):>15.1f} / {max(rec):<6.1f}"
            f"{sum(lost) / len(lost):>20.1f} / {max(lost):<6d}"
        )
    total = trained(soak.rank0)
    goodput = iterations / total if total else 0.0
    st = soak.status
    print(f"\nnodes per attempt: {' -> '.join(str(n) for n in sizes(soak.rank0))}")
    print(
        f"\ngoodput {iterations}/{total} iterations = {goodput:.3f}; restarts {st.get('restarts')} "
        f"{json.dumps(st.get('restartsByReason') or {})}; final size {json.dumps(st.get('size') or {})}"
    )
    print(
        f"final loss {soak.loss} vs undisturbed {ref.loss} "
        f"(|diff| {abs((soak.loss or 0) - (ref.loss or 0)):.2e}); "
        f"wall {soak.seconds:.0f}s vs {ref.seconds:.0f}s"
        + (" (the reference in one process, not on pods)" if ref.status.get("oneProcess") else "")
    )
    problems = list(soak.problems) + left
    if st.get("phase") != "Succeeded":
        problems.append(f"the job ended {st.get('phase')}: {json.dumps(st.get('conditions'))[:400]}")
    if ref.loss is None or soak.loss is None or abs(soak.loss - ref.loss) > LOSS_TOLERANCE:
        problems.append(f"final loss {soak.loss} is not within {LOSS_TOLERANCE} of {ref.loss}")
    for f in soak.faults:
        if f["iterationsLost"] > MOST_LOST:
            problems.append(
                f"{f['what']} lost {f['iterationsLost']} iterations (> {MOST_LOST}: an interval and "
                "the save in flight)"
            )
        if f.get("committedBefore") is not None and f["resumedAt"] <= f["committedBefore"]:
            problems.append(
                f"after {f['what']} the job resumed at iteration {f['resumedAt']}, but checkpoint "
                f"{f['committedBefore']} had committed"
            )
    for p in problems:
        print(f"!! {p}")
    print("OK" if not problems else f"{len(problems)} problem(s)")
    return not problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", type=int, default=10)
    ap.add_argument("--kinds", default=",".join(KINDS), help="fault kinds to draw from, in turn")
    ap.add_argument("--iterations", type=int, default=0, help="default: enough for the faults")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds for the soak run")
    ap.add_argument(
        "--reference",
        choices=("pods", "process"),
        default="pods",
        help="where the undisturbed run trains: the job's six pods, or one trainer process on this "
        "machine (same loss: the trainer matches a single-process run under any layout; faster)",
    )
    ap.add_argument("--state-dir", help="the cluster's state dir (default: next to HOLMES_KUBECONFIG)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    kinds = [k for k in a.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        ap.error(f"unknown fault kinds {bad}; known: {', '.join(KINDS)}")
    rng = random.Random(a.seed)
    order = (kinds * (a.faults // len(kinds) + 1))[: a.faults]
    rng.shuffle(order)
    iterations = a.iterations or 2 * CHECKPOINT_INTERVAL + 40 * a.faults

    cp, kubeconfig = cluster_kubeconfig("bench-soak")
    state = Path(a.state_dir) if a.state_dir else (cp.dir if cp else Path(kubeconfig).resolve().parent)
    if not (state / "cluster.json").exists() and (state / "cluster" / "cluster.json").exists():
        state = state / "cluster"
    c = Cluster(kubeconfig, state)
    tmp = Path(tempfile.mkdtemp(prefix="holmes-soak-"))
    ns = f"soak-{os.getpid()}"
    op = None
    try:
        install_crd(c.kubeconfig)
        c.kubectl("create", "namespace", ns)
        wait_until("the default service account", lambda: c.get("serviceaccount", "default", "-n", ns), 30)
        op = OperatorProcess(kubeconfig, [ns], tmp / "operator.log", extra=["--restart-backoff-seconds=1"])
        op.start()
        shared_dir(tmp / "ref")
        if a.reference == "process":
            print(f">> undisturbed reference run: {iterations} iterations in one trainer process", flush=True)
            ref = run_reference_process("reference", ns, tmp / "ref", iterations, a.timeout)
        else:
            print(f">> undisturbed reference run: {iterations} iterations on the job's pods", flush=True)
            ref = run_job(c, ns, "reference", tmp / "ref", iterations, a.timeout)
        print(f"   {ref.status.get('phase')} in {ref.seconds:.0f}s, final loss {ref.loss}", flush=True)
        print(f">> soak run: {len(order)} faults ({', '.join(order)})", flush=True)
        shared_dir(tmp / "soak")
        soak = run_job(c, ns, "soak", tmp / "soak", iterations, a.timeout, order, op, rng)
        left = leftovers(c, ns, "soak", int(soak.status.get("attempt") or 1))
        ok = report(ref, soak, iterations, left)
        if a.json:
            Path(a.json).write_text(
                json.dumps(
                    {
                        "faults": soak.faults,
                        "status": soak.status,
                        "referenceLoss": ref.loss,
                        "loss": soak.loss,
                        "trained": trained(soak.rank0),
                        "worldSizes": sizes(soak.rank0),
                        "iterations": iterations,
                        "problems": soak.problems + left,
                    },
                    indent=1,
                )
            )
    except (RuntimeError, TimeoutError) as e:
        print(f"!! {e}")
        if op:
            print(op.tail(40))
        ok = False
    finally:
        if op:
            op.stop()
        c.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for n in (c.get("nodes") or {}).get("items", []):
            if n["spec"].get("unschedulable"):
                c.kubectl("uncordon", n["metadata"]["name"], check=False)
        stop_cluster(cp)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
