"""Progress of external frameworks from their own iteration log lines."""

import threading

from holmes.operator.core.framework_progress import from_log, reporting_node_rank

# Megatron-LM's training_log line (print_rank_last), as it formats it
MEGATRON = (
    " [2026-11-24 06:00:01] iteration        7/     100 | consumed samples:          168 | "
    "elapsed time per iteration (ms): 812.4 | throughput per GPU (TFLOP/s/GPU): 141.2 | "
    "learning rate: 2.999000E-04 | global batch size:    24 | lm loss: 7.123456E+00 | "
    "loss scale: 1.0 | grad norm: 3.210 | number of skipped iterations:   0 |"
)
# torchtitan's MetricsProcessor.log line, colours included
TORCHTITAN = (
    "[titan] 2026-11-24 06:00:01,000 - root - INFO - \x1b[31mstep: 12  \x1b[32mloss:  6.54321  "
    "\x1b[33mgrad_norm:  1.2345  \x1b[36mmemory: 10.20GiB(12.00%)  \x1b[34mtps: 5,123  "
    "\x1b[36mtflops: 141.20  \x1b[35mmfu: 45.00%\x1b[39m"
)
DEEPSPEED = "steps: 30 loss: 5.4321 iter time (s): 0.812 samples/sec: 29.557"


def test_megatron_iteration_line():
    text = "\n".join(
        ["noise", MEGATRON.replace("iteration        7", "iteration        6"), MEGATRON, "after"]
    )
    assert from_log("megatron", text) == {
        "iteration": 7,
        "loss": 7.123456,
        "iterationSeconds": 0.8124,
        "tflopsPerGpu": 141.2,
    }


def test_torchtitan_and_deepspeed_lines():
    assert from_log("torchtitan", TORCHTITAN) == {
        "iteration": 12,
        "loss": 6.54321,
        "tokensPerSecond": 5123.0,
        "tflopsPerGpu": 141.2,
    }
    assert from_log("deepspeed", DEEPSPEED) == {"iteration": 30, "loss": 5.4321, "iterationSeconds": 0.812}


def test_nothing_known_or_nothing_printed_yet():
    assert from_log("torchrun", MEGATRON) == {}
    assert from_log("megatron", '{"holmesGroup": {"ranks": [0, 1]}}\nWARNING x') == {}
    nan = MEGATRON.replace("7.123456E+00", "nan")
    assert from_log("megatron", nan) == {"iteration": 7, "iterationSeconds": 0.8124, "tflopsPerGpu": 141.2}


def test_megatron_reports_from_the_last_stage():
    assert reporting_node_rank("megatron", 6) == 5 and reporting_node_rank("torchtitan", 6) == 0


def test_the_progress_reader_reads_the_framework_line_from_its_reporting_pod():
    from holmes.operator.progress import ProgressReader

    def pod(rank):
        labels = {"holmes.dev/attempt": "1", "holmes.dev/node-rank": str(rank)}
        return {"metadata": {"name": f"j-1-{rank}", "uid": f"u{rank}", "labels": labels}, "status": {}}

    job = {
        "metadata": {"namespace": "ns", "name": "j"},
        "spec": {"framework": "megatron"},
        "status": {"launched": True, "phase": "Running", "attempt": 1, "layout": {"nodes": 3}},
    }
    asked = []

    def tail(p, lines=20):
        asked.append((p["metadata"]["name"], lines))
        return "warming up\n" + MEGATRON

    read = threading.Event()
    reader = ProgressReader(9400, interval=3600, on_read=lambda key: read.set())
    pods = [pod(0), pod(1), pod(2)]
    assert reader.read(job, pods, tail) is None  # started on the reader's thread
    assert read.wait(10)
    found = reader.read(job, pods, tail)  # the next reconcile gets it
    assert found["iteration"] == 7 and found["loss"] == 7.123456
    assert asked == [("j-1-2", 200)]  # the last stage's pod, a longer tail than the trainer's last line
