"""Pure rendering for external frameworks: the plan as each framework's arguments, Megatron's
communicator files, the launcher's pod changes, and plan-time argument conflicts."""

import pytest
import yaml

from holmes.contract import JobSpec
from holmes.operator.core import framework_launch as fw
from tests.helpers.frameworks.framework_helpers import MEGATRON, job, launched


def test_megatron_pods_run_the_users_command_under_the_launcher_with_the_plan_appended():
    w, d = launched(job())
    assert len(d.create_pods) == 6, w.reasons()
    from holmes.contract import Layout

    layout = Layout.from_json(d.configmap["data"]["layout.json"])
    counts = [s.num_layers for s in layout.stages]
    assert len(counts) == 3 and sum(counts) == 8
    for pod in d.create_pods:
        rank = int(pod["metadata"]["labels"]["holmes.dev/node-rank"])
        stage = layout.rank_info(rank * 2).stage
        (c,) = pod["spec"]["containers"]
        assert c["image"] == "registry.example/megatron:1"  # the user's image
        assert c["command"][:4] == ["python3", "/holmes-launch/launch.py", "--", *MEGATRON[:1]]
        appended = c["command"][3 + len(MEGATRON) :]
        assert c["command"][3 : 3 + len(MEGATRON)] == MEGATRON
        pairs = dict(zip(appended[::2], appended[1::2]))
        assert pairs["--tensor-model-parallel-size"] == "2" and pairs["--pipeline-model-parallel-size"] == "3"
        assert pairs["--num-layers"] == "8" and pairs["--micro-batch-size"] == "1"
        assert pairs["--global-batch-size"] == "24"
        layout_arg = "|".join(
            ("E" if s == 0 else "") + f"t*{n}" + ("L" if s == 2 else "") for s, n in enumerate(counts)
        )
        assert pairs["--pipeline-model-parallel-layout"] == layout_arg.replace("t*1", "t")
        assert pairs["--nccl-communicator-config-path"] == f"/etc/holmes/megatron-nccl-stage-{stage}.yaml"
        (init,) = pod["spec"]["initContainers"]
        assert init["command"] == ["python", "-m", "holmes.launch.install", "/holmes-launch"]
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert not init["securityContext"]["allowPrivilegeEscalation"]
        assert {"name": "holmes-launch", "emptyDir": {}} in pod["spec"]["volumes"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["HOLMES_FRAMEWORK"] == "megatron" and env["HOLMES_FABRIC_CHECK"] == "warn"
        assert "NCCL_NET" not in env and env["NODE_RANK"] == str(rank)
    for s, stage in enumerate(layout.stages):
        cfg = yaml.safe_load(d.configmap["data"][f"megatron-nccl-stage-{s}.yaml"])
        assert cfg["dp"]["net_name"] == stage.dp_net and cfg["pp"]["net_name"] == "Socket"


def test_megatron_layout_string():
    from holmes.contract import Layout

    w, d = launched(job())
    layout = Layout.from_json(d.configmap["data"]["layout.json"])
    text = fw.megatron_layout(layout)
    assert text.startswith("E") and text.endswith("L") and text.count("|") == 2


def test_torchtitan_arguments_and_model_parts():
    from holmes.contract import Layout

    w, d = launched(job("torchtitan", ["python", "-m", "torchtitan.train", "--module", "llama3"]))
    layout = Layout.from_json(d.configmap["data"]["layout.json"])
    c = d.create_pods[0]["spec"]["containers"][0]
    args = c["command"][c["command"].index("llama3") + 1 :]
    i = args.index("--parallelism.module_fqns_per_model_part")
    parts = args[i + 1 :]
    assert len(parts) == 3 and parts[0].startswith("tok_embeddings,layers.0")
    assert parts[-1].endswith("norm,output")
    assert [len([f for f in p.split(",") if f.startswith("layers.")]) for p in parts] == [
        s.num_layers for s in layout.stages
    ]
    pairs = dict(zip(args[:i:2], args[1:i:2]))
    assert pairs["--parallelism.data_parallel_shard_degree"] == str(layout.data)
    assert pairs["--training.local_batch_size"] == str(layout.micro_batches * layout.micro_batch_size)


def test_deepspeed_and_torchrun_get_no_arguments_but_the_launcher():
    for name in ("deepspeed", "torchrun"):
        w, d = launched(job(name, ["python", "train.py", "--deepspeed_config", "ds.json"]))
        c = d.create_pods[0]["spec"]["containers"][0]
        assert c["command"] == [
            "python",
            "/holmes-launch/launch.py",
            "--",
            "python",
            "train.py",
            "--deepspeed_config",
            "ds.json",
        ]
        assert set(d.configmap["data"]) == {"layout.json", "job.yaml", "launch-spec.json"}


def test_holmes_framework_pods_are_unchanged():
    m = job()
    del m["spec"]["framework"], m["spec"]["template"]
    w, d = launched(m)
    assert d.create_pods, w.reasons()
    assert all("initContainers" not in p["spec"] for p in d.create_pods)
    assert d.create_pods[0]["spec"]["containers"][0]["command"][:3] == ["python", "-m", "holmes.trainer.run"]


def test_an_argument_contradicting_the_plan_stalls_with_both_values():
    # pipeline: auto, so only the plan knows it; the user pinned Megatron to 2 stages
    w, d = launched(job(command=[*MEGATRON, "--pipeline-model-parallel-size", "2"], pipeline="auto"))
    JobSpec.from_manifest(w.job)  # the spec itself is fine
    stalled = w.condition("Stalled")
    assert stalled["reason"] == "InvalidSpec" and not d.create_pods
    msg = stalled["message"]
    assert "--pipeline-model-parallel-size 2" in msg and "the plan's pipeline size" in msg
    planned = int(msg.split("(spec.parallelism.pipeline) is ")[1].split(";")[0])
    assert planned != 2


@pytest.mark.parametrize("framework, taken", [("megatron", "holmes-launch"), ("holmes", "holmes-layout")])
def test_a_template_mount_replaced_by_holmes_does_not_stand_in_for_dev_shm(framework, taken):
    """A template volume named like one of Holmes' own is replaced by Holmes'; mounted at
    /dev/shm it must not keep the pod from its memory-backed /dev/shm (it used to leave the
    launcher's pods with none at all)."""
    m = job(framework, volumeMounts=[{"name": taken, "mountPath": "/dev/shm"}])
    m["spec"]["template"]["spec"]["volumes"] = [{"name": taken, "emptyDir": {"sizeLimit": "1Gi"}}]
    if framework == "holmes":
        del m["spec"]["framework"]
    w, d = launched(m)
    assert len(d.create_pods) == 6, w.reasons()
    for pod in d.create_pods:
        (c,) = pod["spec"]["containers"]
        shm = [mnt for mnt in c["volumeMounts"] if mnt["mountPath"] == "/dev/shm"]
        assert shm == [{"name": "dshm", "mountPath": "/dev/shm"}], c["volumeMounts"]
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}
        assert volumes[taken] != {"name": taken, "emptyDir": {"sizeLimit": "1Gi"}}  # Holmes' own instead
