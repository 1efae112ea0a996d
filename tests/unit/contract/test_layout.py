import json

import pytest

from holmes.contract.layout import GroupFamily, Layout, LayoutError, Stage


def two_stage_layout(**kw) -> Layout:
    args = dict(
        tensor=1,
        pipeline=2,
        data=4,
        gpus_per_node=2,
        nodes=("ib-0", "ib-1", "roce-0", "roce-1"),
        stages=(
            Stage(0, (0, 5), "east/infiniband", "infiniband", "IB"),
            Stage(1, (5, 8), "west/roce", "roce", "IB"),
        ),
        groups=(
            GroupFamily("dp", "IB", 0),
            GroupFamily("dp", "IB", 1),
            GroupFamily("pp", "Socket"),
            GroupFamily("p2p", "Socket", 0),
        ),
        micro_batch_size=2,
        micro_batches=4,
    )
    args.update(kw)
    return Layout(**args)


def test_rank_numbering_follows_torchrun_and_stage_blocks():
    lay = two_stage_layout()
    info = lay.rank_info(5)
    assert (info.node, info.local_rank, info.stage, info.dp_index) == ("roce-0", 1, 1, 1)
    assert lay.stage_nodes(0) == ("ib-0", "ib-1")
    dp = [g.ranks for g in lay.process_groups("dp")]
    assert dp == [(0, 1, 2, 3), (4, 5, 6, 7)]
    pp = [g.ranks for g in lay.process_groups("pp")]
    assert pp == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert lay.groups_of(6)["dp"].ranks == (4, 5, 6, 7)
    assert [g.ranks for g in lay.process_groups("p2p")] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert {b: g.ranks for b, g in lay.p2p_groups_of(5).items()} == {0: (1, 5)}


def test_one_p2p_group_per_boundary_with_its_own_net():
    """Three stages, the first two on one IB island: boundary 0 on IB, boundary 1 on sockets."""
    lay = two_stage_layout(
        pipeline=3,
        data=1,
        gpus_per_node=1,
        nodes=("ib-0", "ib-1", "roce-0"),
        stages=(
            Stage(0, (0, 3), "east/infiniband", "infiniband", "IB"),
            Stage(1, (3, 6), "east/infiniband", "infiniband", "IB"),
            Stage(2, (6, 8), "west/roce", "roce", "IB"),
        ),
        groups=(GroupFamily("pp", "Socket"), GroupFamily("p2p", "IB", 0), GroupFamily("p2p", "Socket", 1)),
    )
    assert {b: (g.ranks, g.net) for b, g in lay.p2p_groups_of(1).items()} == {
        0: ((0, 1), "IB"),
        1: ((1, 2), "Socket"),
    }
    with pytest.raises(LayoutError, match="one p2p group family per stage boundary 0..1"):
        two_stage_layout(
            **{**lay.__dict__, "groups": (GroupFamily("pp", "Socket"), GroupFamily("p2p", "IB", 0))}
        )


def test_version_1_layouts_are_still_read():
    """Written by an older operator: no worldNet (Socket), no p2p groups (pipeline on pp)."""
    d = two_stage_layout().to_dict()
    d["version"] = 1
    del d["worldNet"]
    d["groups"] = [g for g in d["groups"] if g["kind"] != "p2p"]
    lay = Layout.from_dict(d)
    assert lay.world_net == "Socket" and not list(lay.process_groups("p2p"))
    d["version"] = 5
    with pytest.raises(LayoutError, match="version 5 is not supported"):
        Layout.from_dict(d)


def test_json_round_trip_is_lossless():
    lay = two_stage_layout(estimate={"iterationSeconds": 1.5})
    text = lay.to_json()
    again = Layout.from_json(text)
    assert again.to_dict() == lay.to_dict()
    assert json.loads(text)["worldSize"] == 8


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(data=3), "ranks"),
        (dict(nodes=("a", "a", "b", "c")), "twice"),
        (
            dict(stages=(Stage(0, (0, 5), "e", "infiniband", "IB"), Stage(1, (6, 8), "w", "roce", "IB"))),
            "must start at 5",
        ),
        (
            dict(stages=(Stage(0, (0, 5), "e", "infiniband", "IB"), Stage(1, (5, 8), "w", "myrinet", "IB"))),
            "nic",
        ),
        (dict(groups=(GroupFamily("dp", "IB", 7),)), "stage"),
        # one stage has no first/last pair: the groups would list each rank twice
        (
            dict(
                pipeline=1,
                data=8,
                stages=(Stage(0, (0, 8), "e", "infiniband", "IB"),),
                groups=(GroupFamily("dp", "IB", 0), GroupFamily("embedding", "IB")),
            ),
            "pipeline > 1",
        ),
    ],
)
def test_broken_layouts_are_refused_with_the_reason(change, message):
    with pytest.raises(LayoutError, match=message):
        two_stage_layout(**change)


def test_from_json_names_missing_field_and_version():
    d = two_stage_layout().to_dict()
    del d["nodes"]
    with pytest.raises(LayoutError, match="'nodes'"):
        Layout.from_dict(d)
    d = two_stage_layout().to_dict()
    d["version"] = 99
    with pytest.raises(LayoutError, match="version 99"):
        Layout.from_dict(d)


def nvl_layout(**kw) -> Layout:
    """tensor 8 on 4-GPU nodes: each tensor group spans two nodes of one NVLink domain."""
    args = dict(
        tensor=8,
        pipeline=2,
        data=1,
        gpus_per_node=4,
        nodes=("a0", "a1", "b0", "b1"),
        stages=(
            Stage(0, (0, 5), "east/infiniband", "infiniband", "IB"),
            Stage(1, (5, 8), "east/infiniband", "infiniband", "IB"),
        ),
        groups=(
            GroupFamily("tp", "IB", 0),
            GroupFamily("tp", "IB", 1),
            GroupFamily("pp", "IB"),
            GroupFamily("p2p", "IB", 0),
        ),
        micro_batch_size=1,
        micro_batches=4,
        version=4,
        nvlink_domains=(("uuid.1", ("a0", "a1")), ("uuid.2", ("b0", "b1"))),
    )
    args.update(kw)
    return Layout(**args)


def test_tensor_groups_span_the_nodes_of_one_nvlink_domain():
    lay = nvl_layout()
    assert [g.ranks for g in lay.process_groups("tp")] == [tuple(range(8)), tuple(range(8, 16))]
    assert lay.tensor_spans_nodes and lay.nvlink_domain("b1") == "uuid.2"
    again = Layout.from_json(lay.to_json())
    assert again.to_dict() == lay.to_dict() and again.to_dict()["nvlinkDomains"] == {
        "uuid.1": ["a0", "a1"],
        "uuid.2": ["b0", "b1"],
    }


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(nvlink_domains=(("uuid.1", ("a0", "b0")), ("uuid.2", ("a1", "b1")))), "spans NVLink domains"),
        (dict(nvlink_domains=(("uuid.1", ("a0", "a1")),)), "nodes in no NVLink domain"),
        (dict(version=2), "need layout version 4"),
        (dict(tensor=6, data=1, nodes=("a0", "a1", "b0")), "must divide gpusPerNode 4, or be a multiple"),
    ],
)
def test_tensor_groups_across_domains_or_without_one_are_refused(change, message):
    with pytest.raises(LayoutError, match=message):
        nvl_layout(**change)


def test_version_4_is_only_for_tensor_groups_across_nodes():
    with pytest.raises(LayoutError, match="version 4 is only for them"):
        two_stage_layout(version=4)


def test_a_version_4_layout_may_hold_virtual_stages_too():
    """Tensor groups across nodes and an interleaved schedule: version 4 carries the chunks and
    the schedule, and reads back the same."""
    lay = nvl_layout(
        stages=(
            Stage(0, (0, 6), "east/infiniband", "infiniband", "IB", chunks=((0, 2), (4, 6))),
            Stage(1, (2, 8), "east/infiniband", "infiniband", "IB", chunks=((2, 4), (6, 8))),
        ),
        groups=(
            GroupFamily("tp", "IB", 0),
            GroupFamily("tp", "IB", 1),
            GroupFamily("pp", "IB"),
            GroupFamily("p2p", "IB", 0),
            GroupFamily("p2p", "IB", 1),
        ),
        schedule="Interleaved1F1B",
    )
    d = lay.to_dict()
    assert d["version"] == 4 and d["pipelineSchedule"] == "Interleaved1F1B" and d["stages"][0]["chunks"]
    assert Layout.from_dict(d).to_dict() == d and Layout.from_dict(nvl_layout().to_dict()).virtual_stages == 1
