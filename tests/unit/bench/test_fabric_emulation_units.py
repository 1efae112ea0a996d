"""Pure parts of bench/fabric_emulation.py, bench/fabric_netns.py and bench/delay_line.py: the
emulated fabric's names, addresses and commands (which must never touch the host's network), the
delay line's queue, the planner's layouts for the emulated islands, the launch commands, and the
process-tree cleanup. The benchmark itself (root, namespaces, torchrun) is not run here."""

import ipaddress
import os
import subprocess
import time

import delay_line  # noqa: E402
import fabric_emulation as fe  # noqa: E402
import fabric_netns as fab  # noqa: E402
import pytest


def test_two_islands_interleave_by_name_with_unique_addresses_and_short_interface_names():
    spec = fab.two_islands(per_island=3)
    assert [n.name for n in spec.nodes] == [f"node-{i}" for i in range(1, 7)]
    assert [n.island for n in spec.nodes] == list("ababab")  # name order mixes the islands
    addrs = [ipaddress.ip_address(n.addr) for n in spec.nodes]
    assert len(set(addrs)) == 6 and all(a in ipaddress.ip_network("10.200.0.0/24") for a in addrs)
    assert all(len(n.port) <= fab.IFNAMSIZ for n in spec.nodes)
    assert {(n.cluster, n.nic) for n in spec.nodes} == {("east", "infiniband"), ("west", "roce")}
    assert spec.node("node-4").island == "b"
    with pytest.raises(KeyError, match="node-9"):
        spec.node("node-9")
    with pytest.raises(ValueError):
        fab.two_islands(per_island=10)
    with pytest.raises(ValueError):
        fab.two_islands(cross_mbit=-1)


@pytest.mark.parametrize("fast,cross", [(2000, 200), (0, 200), (2000, 0)])
def test_setup_only_touches_our_namespaces_and_shapes_what_was_asked(fast, cross):
    spec = fab.two_islands(fast_mbit=fast, cross_mbit=cross)
    ours = set(spec.namespaces)
    cmds = fab.setup_commands(spec)
    for c in cmds:
        if c[:3] == ["ip", "netns", "add"]:
            assert c[3] in ours
        else:  # everything else runs inside a namespace we created: never the host's
            assert c[0] in ("ip", "tc") and c[1] == "-n" and c[2] in ours, c
        if "veth" in c and "peer" in c and c[2] != fab.SWITCH_NS:
            assert c[-2:] == ["netns", fab.SWITCH_NS]  # the peer is born outside the host too
    tbf = [c for c in cmds if "tbf" in c]
    trunk = [c for c in tbf if c[2] == fab.SWITCH_NS and c[6] in ("x-a", "x-b")]
    assert len(trunk) == (2 if cross else 0)
    assert len(tbf) - len(trunk) == (2 * len(spec.nodes) if fast else 0)  # each NIC, both directions
    if cross:
        assert trunk[0][trunk[0].index("rate") + 1] == f"{cross}mbit"


def test_shape_command_and_burst():
    assert fab.shape_cmd("hfe-switch", "x-a", 0) == [
        "tc",
        "-n",
        "hfe-switch",
        "qdisc",
        "del",
        "dev",
        "x-a",
        "root",
    ]
    assert fab.tbf_burst_bytes(200) == 256 * 1024  # the measured-good setting
    assert fab.tbf_burst_bytes(2000) == 2_000_000  # 8 ms at line rate
    assert "replace" in fab.shape_cmd("hfe-switch", "x-a", 150)  # re-shaping needs no delete first


def test_hosts_file_names_every_node_and_maps_the_host_name_to_the_node_itself():
    spec = fab.two_islands()
    me = spec.node("node-2")
    text = fab.hosts_file(spec, me, ("vm",))
    lines = text.splitlines()
    assert lines[0] == "127.0.0.1 localhost"
    assert f"{me.addr} node-2 vm" in lines
    assert sum("vm" in l.split() for l in lines) == 1
    assert all(f"{n.addr} {n.name}" in text for n in spec.nodes)


@pytest.fixture(scope="module")
def cases():
    a = fe.build_parser().parse_args([])
    spec = fab.two_islands()
    return spec, a, fe.plans(spec, fe.job_manifest(a, 4), tflops=0.05, intra_gbps=1.9, cross_gbps=0.19)


def test_planner_keeps_dp_inside_islands_and_rank_order_does_not(cases):
    spec, a, cs = cases
    by = {c.name: c for c in cs}
    holmes, rank = by["holmes"].layout, by["rank order"].layout
    assert (holmes.pipeline, holmes.data) == (rank.pipeline, rank.data) == (2, 2)
    assert not fe.crosses(holmes, spec, "dp") and fe.crosses(holmes, spec, "pp")
    assert fe.crosses(rank, spec, "dp") and not fe.crosses(rank, spec, "pp")
    assert all(g.net == "IB" for g in holmes.process_groups("dp"))
    assert all(g.net == "Socket" for g in rank.process_groups("dp"))
    # the other two cases run the holmes layout itself; the estimates order as the physics does
    assert by["holmes sync"].layout is holmes and by["all-fast"].layout is holmes
    assert not by["all-fast"].trunk_shaped and by["holmes sync"].env == {"HOLMES_OVERLAP": "0"}
    est = {n: c.estimate["iterationSeconds"] for n, c in by.items()}
    assert est["all-fast"] <= est["holmes"] < est["holmes sync"] and est["holmes"] < est["rank order"]
    job = fe.job_manifest(a, 4)["spec"]
    assert job["training"]["globalBatchSize"] == 2 * a.micro_batch * a.micro_batches
    assert job["training"]["iterations"] == a.warmup + a.iters


def test_launch_commands_follow_the_layout_node_order(cases):
    spec, _, cs = cases
    lay = cs[1].layout  # rank order: node-1, node-2, ...
    cmds = fe.launch_commands(lay, spec, "j.yaml", "l.json", "m.jsonl", python="py")
    assert [n for n, _ in cmds] == list(lay.nodes)
    for rank, (name, c) in enumerate(cmds):
        assert c[:4] == ["ip", "netns", "exec", spec.node(name).netns]
        assert f"--node-rank={rank}" in c and f"--master-addr={lay.nodes[0]}" in c
        assert ("--metrics-file" in c) == (rank == 0)


def test_each_core_runs_one_whole_pipeline_in_every_layout(cases):
    _, _, cs = cases
    for c in cs:
        per_core = {}
        for r in range(c.layout.world_size):
            per_core.setdefault(fe.core_of(c.layout, r, [0, 1]), []).append(c.layout.rank_info(r).stage)
        assert {k: sorted(v) for k, v in per_core.items()} == {0: [0, 1], 1: [0, 1]}, c.name


def test_summary_drops_warmup_and_takes_medians():
    lines = [{"holmes": "start"}] + [
        {
            "holmes": "iteration",
            "iterationSeconds": s,
            "tokensPerSecond": 100 / s,
            "loss": s,
            "time": {"exposedComm": 0.1 * s, "bubble": 0.0, "compute": s},
        }
        for s in (9.0, 1.0, 3.0, 2.0)
    ]
    its = fe.measured_iterations(lines, warmup=1)
    r = fe.summarize_run(its)
    assert r["seconds"] == 2.0 and r["tokensPerSecond"] == 50.0 and r["iterations"] == 3
    with pytest.raises(ValueError, match="warm-up"):
        fe.measured_iterations(lines, warmup=4)


def test_kill_tree_stops_a_launcher_and_what_it_started():
    p = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    deadline = time.time() + 5
    while len(fe.descendants(p.pid)) < 2 and time.time() < deadline:
        time.sleep(0.05)
    kids = fe.descendants(p.pid)
    assert len(kids) == 2
    fe.kill_tree([p])
    assert p.poll() is not None
    assert all(fe._zombie(k) for k in kids)  # gone (or a zombie about to be reaped by init)


def test_a_delayed_trunk_is_two_taps_on_the_bridges_and_a_plain_one_stays_a_veth():
    plain = fab.setup_commands(fab.two_islands(cross_mbit=3))
    delayed = fab.setup_commands(fab.two_islands(cross_mbit=3, cross_delay_ms=20))
    assert ["ip", "-n", fab.SWITCH_NS, "link", "add", "x-a", "type", "veth", "peer", "name", "x-b"] in plain
    assert not any("tuntap" in c for c in plain)
    taps = [c for c in delayed if "tuntap" in c]
    assert [c[c.index("dev") + 1] for c in taps] == ["x-a", "x-b"]
    assert all(c[:3] == ["ip", "-n", fab.SWITCH_NS] and c[-2:] == ["mode", "tap"] for c in taps)
    assert not any("veth" in c and "x-a" in c for c in delayed)
    # the same names either way: the trunk's tbf and masters apply unchanged
    for isl in "ab":
        assert ["ip", "-n", fab.SWITCH_NS, "link", "set", f"x-{isl}", "master", f"br-{isl}"] in delayed
    assert [c for c in delayed if "tbf" in c and c[6].startswith("x-")] == fab.trunk_commands(3)
    with pytest.raises(ValueError, match="cross_delay_ms"):
        fab.two_islands(cross_delay_ms=-1)


def test_the_delay_line_runs_in_the_switch_namespace_between_the_trunks_ends():
    cmd = fab.delay_line_cmd(20)
    assert cmd[:4] == ["ip", "netns", "exec", fab.SWITCH_NS]
    assert cmd[5].endswith("bench/delay_line.py") and os.path.exists(cmd[5])
    assert cmd[-3:] == ["x-a", "x-b", "20"]
    assert fab.trunk_removal_commands() == [
        ["ip", "-n", fab.SWITCH_NS, "link", "del", "x-a"],
        ["ip", "-n", fab.SWITCH_NS, "link", "del", "x-b"],
    ]


def test_the_delay_queue_holds_each_frame_for_the_delay_in_arrival_order():
    q = delay_line.DelayQueue(0.020)
    assert q.wait_s(0.0) is None  # empty: wait for a frame, not a timer
    q.push(1.000, b"one")
    q.push(1.005, b"two")
    q.push(1.005, b"three")
    assert q.due(1.019) == [] and q.wait_s(1.019) == pytest.approx(0.001)
    assert q.due(1.020) == [b"one"]
    assert q.due(1.030) == [b"two", b"three"]  # same deadline: in the order they came
    assert q.due(9.0) == [] and q.wait_s(9.0) is None
    late = delay_line.DelayQueue(0.020)
    late.push(1.0, b"x")
    assert late.wait_s(5.0) == 0.0  # overdue: no negative timeout


def test_a_full_delay_queue_drops_and_counts_and_the_loop_waits_for_the_earliest_head():
    q = delay_line.DelayQueue(0.010, limit=2)
    for i in range(3):
        q.push(0.0, bytes([i]))
    assert q.dropped == 1 and q.due(1.0) == [b"\x00", b"\x01"]
    a, b = delay_line.DelayQueue(0.040), delay_line.DelayQueue(0.010)
    assert delay_line.next_timeout([a, b], 0.0) is None
    a.push(0.0, b"a")
    b.push(0.015, b"b")
    assert delay_line.next_timeout([a, b], 0.020) == pytest.approx(0.005)  # b's head, before a's
    with pytest.raises(ValueError, match="delay"):
        delay_line.DelayQueue(-0.001)


def test_rtt_is_the_median_of_the_connects():
    assert fab.median([0.04, 0.09, 0.041]) == 0.041  # the first connect also waited on ARP
    assert fab.median([1.0, 3.0]) == 2.0


def test_the_round_trip_check_fails_without_the_delay_and_warns_when_load_adds_to_it():
    assert fab.rtt_check(40.5, 20) == (None, None)
    assert fab.rtt_check(0.03, 0)[0] is None  # no delay asked: nothing to miss
    error, _ = fab.rtt_check(0.05, 20)
    assert error and "not in the path" in error
    _, warning = fab.rtt_check(58.0, 20)
    assert warning and "18.0 ms over" in warning
