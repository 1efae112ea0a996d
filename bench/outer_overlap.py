"""How much of the outer exchange acrossIslands.overlapSteps hides: two replicas over a slow link.

    sudo .venv/bin/python bench/outer_overlap.py                # the numbers in docs/trainer.md
    sudo .venv/bin/python bench/outer_overlap.py --smoke        # the code path; numbers mean little

Two network namespaces of this run's own (``hov<pid>-a``, ``-b``), joined by one veth pair shaped
with tbf at --mbit each way (bench/fabric_netns.shape_cmd): the link between two islands. One
replica per namespace, each a world of one rank (the real trainer, gloo, a small GPT on synthetic
data), each in a CPU cgroup of its own at --cores cores (bench/cpu_limit.py), so neither lends its
CPU to the other. The same job runs once per --overlap value (innerSteps --inner-steps, fragments
--fragments); per run, from rank 0's iteration lines of replica 0:

  compute_s   the median iteration with no exchange in it (overlap 0's iterations between
              exchanges): the replica's own work
  exchange_s  overlap 0: the median synchronous exchange (outer record's seconds), one fragment
  s/it        the mean iteration after overlap 0's first outer step (one window for all runs)
  exposed     s/it - compute_s: what the exchange still costs per iteration
  hidden      1 - exposed / exposed at overlap 0: the share the overlap took off the link's cost,
              beside the planner's estimate (holmes.plan.across_plan.hidden_fraction) from
              compute_s and exchange_s

--repeat runs every case that many rounds, each round against its own overlap 0 (the machine's
load drifts between rounds); the last line is one JSON object with every round and the median
hidden share per overlap. No sch_netem on this kernel: the link has bandwidth, no delay.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "hack")]
import cpu_limit  # noqa: E402
import fabric_emulation as fe  # noqa: E402
import fabric_netns as fab  # noqa: E402
from holmes_dev.jobs import holmes_job  # noqa: E402

from holmes.contract.layout import GroupFamily, Layout, Stage  # noqa: E402
from holmes.plan.across_plan import hidden_fraction  # noqa: E402

SUBNET = "10.201.0"  # not fabric_netns' 10.200.0: both may exist at once
OUTER_PORT = 29600


# ---- pure: the link, the job, the numbers -----------------------------------------------------------


def namespaces(pid: int) -> tuple[str, str]:
    return f"hov{pid}-a", f"hov{pid}-b"


def link_commands(ns: tuple[str, str], mbit: float) -> list[list[str]]:
    """Two namespaces joined by one veth pair (eth0 in each), both ends shaped at ``mbit``."""
    a, b = ns
    cmds = [["ip", "netns", "add", a], ["ip", "netns", "add", b]]
    cmds += [["ip", "-n", a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", b]]
    for i, n in enumerate(ns, start=1):
        cmds += [
            ["ip", "-n", n, "addr", "add", f"{SUBNET}.{i}/24", "dev", "eth0"],
            ["ip", "-n", n, "link", "set", "eth0", "up"],
            ["ip", "-n", n, "link", "set", "lo", "up"],
            fab.shape_cmd(n, "eth0", mbit),
        ]
    return cmds


def job(a: argparse.Namespace, overlap: int) -> dict[str, Any]:
    return holmes_job(
        "overlap",
        {
            "model": {
                "layers": a.layers,
                "hiddenSize": a.hidden,
                "attentionHeads": 4,
                "seqLength": a.seq,
                "vocabSize": 256,
            },
            "training": {
                "globalBatchSize": a.batch,
                "microBatchSize": a.batch // 2,
                "iterations": a.iterations,
                "learningRate": 1.0e-3,
                "activationRecompute": False,
                "acrossIslands": {
                    "mode": "replicas",
                    "innerSteps": a.inner_steps,
                    "fragments": a.fragments,
                    "overlapSteps": overlap,
                },
            },
            "nodes": {"count": 2, "gpusPerNode": 1},
        },
    )


def whole_model(node: str, layers: int, micro_batch: int) -> Layout:
    return Layout(
        tensor=1,
        pipeline=1,
        data=1,
        gpus_per_node=1,
        nodes=(node,),
        stages=(Stage(0, (0, layers), "isl/ethernet", "ethernet", "Socket"),),
        groups=(GroupFamily("dp", "Socket", 0), GroupFamily("pp", "Socket")),
        micro_batch_size=micro_batch,
        micro_batches=2,
    )


def summarize(runs: dict[int, list[dict]], fragments: int) -> dict[str, Any]:
    """``runs``: overlap steps -> replica 0's iteration lines, overlap 0 among them."""
    sync = runs[0]
    compute = statistics.median(r["iterationSeconds"] for r in sync[1:] if "outer" not in r)
    exchange = statistics.median(r["outer"]["seconds"] for r in sync if "outer" in r)

    # one window for every run: from the first synchronous exchange's next iteration to the end
    start = next(i for i, r in enumerate(sync) if "outer" in r) + 1

    def steady(lines: list[dict]) -> float:
        return statistics.mean(r["iterationSeconds"] for r in lines[start:])

    base = steady(sync) - compute
    rows = []
    for tau, lines in sorted(runs.items()):
        exposed = steady(lines) - compute
        rows.append(
            {
                "overlapSteps": tau,
                "secondsPerIteration": round(steady(lines), 4),
                "exposedSeconds": round(exposed, 4),
                "hiddenMeasured": round(1 - exposed / base, 3) if tau else 0.0,
                "hiddenPlanned": round(hidden_fraction(exchange * fragments, fragments, tau, compute), 3),
                "waitSeconds": round(
                    statistics.median(
                        r["outer"].get("waitSeconds", r["outer"]["seconds"]) for r in lines if "outer" in r
                    ),
                    4,
                ),
            }
        )
    return {"computeSeconds": round(compute, 4), "exchangeSeconds": round(exchange, 4), "runs": rows}


# ---- I/O ----------------------------------------------------------------------------------------------


def run_case(a, ns, limits, names, workdir: str, overlap: int) -> list[dict]:
    d = os.path.join(workdir, f"overlap-{overlap}")
    os.makedirs(d)  # and workdir, a round's own
    job_file = os.path.join(d, "job.yaml")
    with open(job_file, "w") as f:
        yaml.safe_dump(job(a, overlap), f)
    procs, logs = [], []
    try:
        for r in (0, 1):
            lay_file = os.path.join(d, f"layout-{r}.json")
            with open(lay_file, "w") as f:
                f.write(whole_model(f"island-{r}", a.layers, a.batch // 2).to_json())
            metrics = os.path.join(d, f"metrics-{r}.jsonl")
            cmd = ["ip", "netns", "exec", ns[r], sys.executable, "-m", "holmes.trainer"]
            cmd += ["--job", job_file, "--layout", lay_file, "--metrics-file", metrics]
            env = fe.trainer_env(a.timeout, 40_000_000, d, {
                "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
                "HOLMES_REPLICA": str(r), "HOLMES_REPLICAS": "2",
                "HOLMES_OUTER_ADDR": f"{SUBNET}.1:{OUTER_PORT}",
            })  # fmt: skip
            p, log = fe.start(f"replica-{r}", limits.wrap(names[r], cmd), env, d)
            logs.append(log)
            procs.append(p)
        deadline = time.time() + a.timeout
        while any(p.poll() is None for p in procs) and time.time() < deadline:
            time.sleep(0.3)
    finally:
        fe.kill_tree(procs)
        for p in procs:
            fe.LIVE.remove(p)
        for log in logs:
            log.close()
    if any(p.returncode for p in procs):
        tail = open(os.path.join(d, "replica-0.log")).read()[-1500:]
        raise RuntimeError(
            f"overlap {overlap}: exit codes {[p.returncode for p in procs]} (logs in {d}):\n{tail}"
        )
    with open(os.path.join(d, "metrics-0.jsonl")) as f:
        return [x for x in map(json.loads, filter(str.strip, f)) if x.get("holmes") == "iteration"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--mbit", type=float, default=20, help="the link between the replicas, each way")
    ap.add_argument("--cores", type=float, default=0.5, help="CPU budget of each replica (cgroup quota)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="sequences per iteration, per replica")
    ap.add_argument("--iterations", type=int, default=48)
    ap.add_argument("--inner-steps", type=int, default=8)
    ap.add_argument("--fragments", type=int, default=2)
    ap.add_argument("--overlap", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every case, each its own baseline")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args(argv)
    if a.smoke:
        a.layers, a.hidden, a.iterations, a.overlap = 2, 64, 12, [2]
        a.cores = 1.0  # a core per replica: at 0.5 its start-ups (two torch imports) took twice as long
    problems = fab.missing_prerequisites()
    if problems:
        print("cannot shape a link here:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    ns = namespaces(os.getpid())
    names = (f"ov{os.getpid()}a", f"ov{os.getpid()}b")  # cgroups of this run's own: others may run
    workdir = tempfile.mkdtemp(prefix="holmes-overlap-")
    limits = None
    rounds: list[dict[str, Any]] = []
    try:
        for cmd in link_commands(ns, a.mbit):
            fab.run(cmd)
        limits = cpu_limit.CpuLimits.create(dict.fromkeys(names, a.cores), sweep=False)
        for k in range(a.repeat):  # a round's cases minutes apart at most: the machine's load drifts
            runs: dict[int, list[dict]] = {}
            for tau in [0, *a.overlap]:
                print(f">> round {k + 1}: overlapSteps {tau}", file=sys.stderr, flush=True)
                runs[tau] = run_case(a, ns, limits, names, os.path.join(workdir, f"round-{k}"), tau)
            rounds.append(summarize(runs, a.fragments))
    finally:
        fe.kill_tree(list(fe.LIVE))
        if limits is not None:
            limits.remove()
        for n in ns:
            fab.run(["ip", "netns", "del", n], check=False)
    shutil.rmtree(workdir, ignore_errors=True)  # kept, with the logs, when a case failed (raised above)
    print(f"{'round':>5} {'overlap':>7} {'s/it':>7} {'exposed':>8} {'hidden':>7} {'planned':>8} {'wait':>7}")
    for k, got in enumerate(rounds, start=1):
        for r in got["runs"]:
            print(
                f"{k:5d} {r['overlapSteps']:7d} {r['secondsPerIteration']:7.3f} {r['exposedSeconds']:8.3f} "
                f"{r['hiddenMeasured']:7.2f} {r['hiddenPlanned']:8.2f} {r['waitSeconds']:7.3f}"
            )
    median = {
        str(tau): statistics.median(
            r["hiddenMeasured"] for got in rounds for r in got["runs"] if r["overlapSteps"] == tau
        )
        for tau in a.overlap
    }
    print(
        json.dumps(
            {"mbit": a.mbit, "cores": a.cores, "medianHidden": median, "rounds": rounds},
            separators=(",", ":"),
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
