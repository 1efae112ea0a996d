"""Shared by the framework tests: a small external-framework job on the default nodes rendered
by the reconciler, the pods' command and env, and `holmes plan --pods` on the paper's testbed."""

from pathlib import Path

from holmes.cli import main
from tests.helpers.frameworks.megatron_config import transformer_config
from tests.helpers.operator.opfixtures import FakeWorld, default_nodes, manifest, with_link_layers

REPO = Path(__file__).resolve().parents[3]
PAPER = str(REPO / "examples" / "nodes" / "paper.yaml")

MEGATRON = ["python3", "pretrain_gpt.py", "--seq-length", "32", "--tokenizer-type", "NullTokenizer"]


def template(command, args=None, **container):
    c = {"name": "trainer", "image": "registry.example/megatron:1", "command": command, **container}
    if args:
        c["args"] = args
    return {"spec": {"containers": [c]}}


def job(framework="megatron", command=MEGATRON, layers=8, pipeline=3, **extra):
    return manifest(
        count=6,
        gpus=2,
        framework=framework,
        model={"layers": layers, "hiddenSize": 64, "attentionHeads": 4, "seqLength": 32, "vocabSize": 128},
        training={"globalBatchSize": 24, "microBatchSize": 1, "iterations": 5, "learningRate": 1.0e-3},
        parallelism={"pipeline": pipeline, "tensor": 2},
        template=template(command, **extra),
    )


def launched(manifest_):
    w = FakeWorld(manifest_, nodes=with_link_layers(default_nodes()))
    d = w.step()
    return w, d


def plan_pods(capsys, job, *extra):
    code = main(["plan", "--nodes", PAPER, "--job", str(job), "--pods", "--json", *extra])
    out = capsys.readouterr()
    return code, out


def pod_argv(pod):
    """The user's command and Holmes' arguments, as the launcher hands them to torchrun."""
    command = pod["spec"]["containers"][0]["command"]
    return command[command.index("--") + 1 :]


def pod_env(pod):
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}


def small_config(pod):
    """TransformerConfig of a render-test pod (its command leaves the model's width to the spec)."""
    return transformer_config([*pod_argv(pod), "--hidden-size", "64", "--num-attention-heads", "4"])


def titan_config(args):
    """The arguments as torchtitan's trainer parses them: its ConfigManager's tyro rules over its
    own ParallelismConfig and TrainingConfig (its llama3 config registry imports triton, which
    the CPU wheel lacks)."""
    from dataclasses import dataclass, field

    import tyro
    from torchtitan.config.configs import ParallelismConfig, TrainingConfig
    from torchtitan.config.manager import ConfigManager, custom_registry

    ConfigManager()  # registers the tyro rules (comma-separated lists)

    @dataclass
    class Job:
        parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
        training: TrainingConfig = field(default_factory=TrainingConfig)

    return tyro.cli(Job, args=args, registry=custom_registry)
