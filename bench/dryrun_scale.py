"""The dry run at full world size: the example jobs planned on their example topology, then the
real engine for every stage on fake CUDA and the fake process group (holmes.trainer.dryrun).

    .venv/bin/python bench/dryrun_scale.py [--jobs llama3-70b,gpt-7b] [--nodes examples/nodes/paper.yaml]
    .venv/bin/python bench/dryrun_scale.py --small        # what `make test` runs: a 4-layer model

Prints, per job: the layout, the dry run's wall and CPU time, and per stage the planner's
memory estimate next to the dry run's peak (and its breakdown), the communicators per GPU and
the host syncs in a steady-state iteration; then whether every check passed. ``--out F``
writes the whole record as JSON.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hack"))  # holmes_dev: the shared helpers
from holmes_dev.jobs import holmes_job  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SMALL_JOB = holmes_job(
    "small",
    {
        "model": {"layers": 4, "hiddenSize": 256, "attentionHeads": 4, "seqLength": 128, "vocabSize": 1024},
        "training": {
            "globalBatchSize": 32,
            "microBatchSize": 2,
            "iterations": 10,
            "learningRate": 1.0e-3,
            "data": {"synthetic": {}},
        },
        "parallelism": {"tensor": 1, "pipeline": 2, "data": 2},
        "nodes": {"count": 4, "gpusPerNode": 1},
    },
)


def plan(job: Path, nodes: Path) -> dict:
    from holmes.cli import load_nodes
    from holmes.contract import load_job
    from holmes.plan import plan as holmes_plan

    return holmes_plan(load_nodes(str(nodes)), load_job(str(job))).to_dict()


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def dry_run(job: Path, layout: dict, tmp: Path, extra: list[str]) -> tuple[dict, float, float, int]:
    path = tmp / f"{job.stem}.layout.json"
    path.write_text(json.dumps(layout))
    cmd = [sys.executable, "-m", "holmes.trainer.dryrun", "--job", str(job), "--layout", str(path), *extra]
    cpu0, t0 = children_cpu(), time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    if not done.stdout.strip().startswith("{"):
        raise SystemExit(f"the dry run of {job} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout), wall, cpu, done.returncode


def report(name: str, layout: dict, out: dict, wall: float, cpu: float) -> None:
    P, D, T = layout["pipeline"], layout["data"], layout["tensor"]
    print(
        f"\n{name}: {layout['worldSize']} GPUs = pipeline {P} x data {D} x tensor {T}, "
        f"{layout['microBatches']} micro-batches of {layout['microBatchSize']} "
        f"(dry run: {len(out['ranksRun'])} ranks, {out['microBatchesRun']} micro-batches, "
        f"{out['iterations']} iterations) in {wall:.0f} s wall, {cpu:.0f} s CPU"
    )
    syncs = {r["stage"]: r["hostSyncs"] for r in out["ranks"]}
    head = f"{'stage':>5} {'planner GiB':>11} {'dry run GiB':>11} {'ratio':>6}  {'communicators':>13}"
    print(f"{head} {'syncs':>5}  peak by kind (GiB)")
    for s in out["stages"]:
        by = " ".join(f"{k[:5]}={v:.1f}" for k, v in s["dryRunPeakGiBBy"].items())
        planned, ratio = s.get("plannedGiB", float("nan")), s.get("plannedOverDryRun", float("nan"))
        row = f"{s['stage']:>5} {planned:>11.2f} {s['dryRunPeakGiB']:>11.2f} {ratio:>6.3f}"
        print(f"{row}  {s['communicators']:>13} {syncs[s['stage']]:>5}  {by}")
    print(f"sequences match: {out['sequencesMatch']}; problems: {out['problems'] or 'none'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="llama3-70b,gpt-7b", help="examples/jobs/<name>.yaml, comma-separated")
    ap.add_argument("--nodes", default=str(REPO / "examples/nodes/paper.yaml"))
    ap.add_argument("--small", action="store_true", help="a 4-layer model on 4 GPUs (seconds)")
    ap.add_argument(
        "--processes", type=int, help="dry-run processes per job (the tool's --jobs; default: its own)"
    )
    ap.add_argument("--out", help="write every record here as JSON")
    args = ap.parse_args(argv)
    records = {}
    failed = False
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.small:
            job = tmp / "small.yaml"
            job.write_text(yaml.safe_dump(SMALL_JOB))
            nodes = tmp / "nodes.yaml"
            nodes.write_text(yaml.safe_dump(small_nodes()))
            jobs = [(job, nodes)]
        else:
            jobs = [(REPO / "examples/jobs" / f"{n}.yaml", Path(args.nodes)) for n in args.jobs.split(",")]
        for job, nodes in jobs:
            layout = plan(job, nodes)
            out, wall, cpu, code = dry_run(
                job, layout, tmp, ["--jobs", str(args.processes)] if args.processes else []
            )
            report(job.stem, layout, out, wall, cpu)
            failed |= code != 0
            records[job.stem] = {"layout": layout, "dryRun": out, "wallSeconds": wall, "cpuSeconds": cpu}
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))
    return 1 if failed else 0


def small_nodes() -> dict:
    """Four 1-GPU InfiniBand nodes (what examples/nodes/*.yaml describe, smaller)."""
    items = []
    for i in range(4):
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"node-{i}",
                    "labels": {"holmes.dev/nic": "infiniband", "kubernetes.io/hostname": f"node-{i}"},
                },
                "status": {
                    "allocatable": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )
    return {"apiVersion": "v1", "kind": "List", "items": items}


if __name__ == "__main__":
    sys.exit(main())
