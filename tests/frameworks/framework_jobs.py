"""Small HolmesJobs of each spec.framework (the user's image and command in the template) and
the reconciler's first decision on them: shared by the rendering and real-framework tests."""

from __future__ import annotations

from tests.operator.opfixtures import FakeWorld, default_nodes, manifest, with_link_layers

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
