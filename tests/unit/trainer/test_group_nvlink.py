"""A group over the nodes of one NVLink domain (a version-4 Layout) says so in its log line: NCCL's
multi-node NVLink path carries it, the pinned net is the fallback."""

from __future__ import annotations

from holmes.trainer.groups import group_line, nvlink_domain_of
from tests.helpers.trainer.trainer_harness import make_layout


def test_a_tensor_group_over_two_nodes_names_its_nvlink_domain():
    layout = make_layout(2, 1, [2, 2], 2, 4, gpus_per_node=2, tensor=4)
    tp = [g for g in layout.process_groups("tp")]
    assert [g.ranks for g in tp] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    entry = group_line(layout, "tp", tp[0].ranks, "nccl", tp[0].net)
    assert entry["nvlinkDomain"] == "rack-uuid.1" and entry["net"] == "IB" and entry["applied"] is True
    inside = make_layout(2, 1, [2, 2], 2, 4, gpus_per_node=4, tensor=4)
    assert nvlink_domain_of(inside, (0, 1, 2, 3)) is None  # no domains listed: version 2
    assert "nvlinkDomain" not in group_line(inside, "tp", (0, 1, 2, 3), "nccl", "IB")
