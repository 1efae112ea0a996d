"""Builders for DRA ResourceSlices (DRANET NICs, NVIDIA GPUs) used by the planner and operator tests."""

from __future__ import annotations


def rail(i: int, enc: str | None = "infiniband", root: str | None = None, **extra) -> dict:
    attrs = {"dra.net/rdma": {"bool": True}, "dra.net/rdmaDevice": {"string": f"mlx5_{i}"}}
    if enc is not None:
        attrs["dra.net/encapsulation"] = {"string": enc}
    if root is not None:
        attrs["resource.kubernetes.io/pcieRoot"] = {"string": root}
    for k, v in extra.items():
        attrs[f"dra.net/{k}"] = {"bool": v} if isinstance(v, bool) else {"string": v}
    return {"name": f"nic-{i}", "attributes": attrs}


def eth0() -> dict:
    return {
        "name": "eth0",
        "attributes": {"dra.net/rdma": {"bool": False}, "dra.net/ifName": {"string": "eth0"}},
    }


def gpu(i: int, product: str = "NVIDIA A100-SXM4-80GB", root: str | None = None, memory: str | None = None):
    attrs = {"type": {"string": "gpu"}, "productName": {"string": product}}
    if root is not None:
        attrs["resource.kubernetes.io/pcieRoot"] = {"string": root}
    dev: dict = {"name": f"gpu-{i}", "attributes": attrs}
    if memory:
        dev["capacity"] = {"memory": {"value": memory}}
    return dev


def rslice(node: str, driver: str, devices: list, generation: int = 1, pool: str | None = None) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}-{generation}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def dra_node(name: str, zone: str = "east", gpus_allocatable: int = 0) -> dict:
    """A Node with no Holmes label and, by default, no device-plugin GPUs."""
    alloc = {"cpu": "64"}
    if gpus_allocatable:
        alloc["nvidia.com/gpu"] = str(gpus_allocatable)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "holmes.dev/cluster": zone}},
        "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def aligned_slices(node: str, gpus: int = 8, enc: str = "infiniband") -> list[dict]:
    """``gpus`` GPUs and as many RDMA NICs, two of each per PCIe root, plus a plain eth0."""
    roots = [f"pci0000:{0x10 * (1 + i // 2):02x}" for i in range(gpus)]
    nics = [eth0()] + [rail(i, enc, roots[i]) for i in range(gpus)]
    return [
        rslice(node, "dra.net", nics),
        rslice(node, "gpu.nvidia.com", [gpu(i, root=roots[i], memory="80Gi") for i in range(gpus)]),
    ]


def device_classes() -> list[dict]:
    """The classes the operator's claims name by default (discovery.NicMapping), selecting their
    drivers' devices as NVIDIA's and DRANET's charts install them."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        }
        for name, driver in (("gpu.nvidia.com", "gpu.nvidia.com"), ("dranet", "dra.net"))
    ]
