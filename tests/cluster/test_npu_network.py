"""rlbox doctor's NPU network checks (hccn_tool: link, address, net_health, pings to the next
host's NPUs): the parsers over what the real tool prints, and `npunet.judge` over facts, one table
row per verdict. The hccn_tool stand-in (cluster/sim.py) is run here as a file; on testbed hosts,
told to fail: tests/testbed/test_npu_checks_on_testbed.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rlbox.cluster import sim
from rlbox.cluster.preflight import npunet


def read_text(ports: dict[int, tuple[str, str, str]], tool="/usr/local/Ascend/driver/tools/hccn_tool") -> str:
    out = [f"rlbox-hccn: tool {tool}"]
    for d, (link, ip, health) in ports.items():
        out += [f"rlbox-hccn: {d} link", link, f"rlbox-hccn: {d} ip", ip, f"rlbox-hccn: {d} health", health]
    return "\n".join(out) + "\n"


OK = ("link status: UP", "ipaddr:192.168.100.101\nnetmask:255.255.255.0", "net health status: Success")


def test_parsers_read_the_tool_s_own_words():
    net = npunet.parse_read(read_text({0: OK, 1: ("link status: DOWN", "Get ip failed, ret:-2", "net health status: Fault")}))
    assert net.tool.endswith("hccn_tool")
    p0, p1 = net.ports
    assert (p0.link, p0.address, p0.netmask, p0.health) == ("UP", "192.168.100.101", "255.255.255.0", "Success")
    assert (p1.link, p1.address, p1.health) == ("DOWN", None, "Fault") and "Get ip failed" in p1.said
    assert npunet.parse_read("rlbox-hccn: none /usr/local/Ascend/driver/tools/hccn_tool\n").tool is None
    ok = npunet.ping_result(0, "a", "node1 (h) device 0", "3 packets transmitted, 3 received, 0.00% packet loss")
    lost = npunet.ping_result(0, "a", "p", "recv time out seq=0\nrecv time out seq=1\n3 packets transmitted, 0 received, 100.00% packet loss")
    some = npunet.ping_result(0, "a", "p", "3 packets transmitted, 2 received, 33.33% packet loss")
    assert ok.ok and not lost.ok and "recv time out" in lost.detail and not some.ok and "2/3" in some.detail
    pings = npunet.parse_pings("rlbox-hccn: ping 3 192.168.103.2\nrecv time out seq=0\n"
                               "rlbox-hccn: ping 4 192.168.104.2\n3 packets transmitted, 3 received, 0.00% packet loss\n",
                               {(3, "192.168.103.2"): "node1 (h2) device 3"})
    assert [(p.device, p.ok, p.peer) for p in pings] == [(3, False, "node1 (h2) device 3"), (4, True, "192.168.104.2")]


def verdicts(net, devices=(0, 1), multi=True):
    return {name: (ok, detail, fix) for name, ok, detail, fix in npunet.judge(net, devices, multi)}


def healthy():
    return npunet.parse_read(read_text({0: OK, 1: OK}))


ROWS = [
    ("link down", {1: ("link status: DOWN",) + OK[1:]}, "npu link", ["device 1 DOWN"], ["hccn_tool -i 1 -link -g", "optical module"]),
    ("no address", {1: (OK[0], "Get ip failed, ret:-2", OK[2])}, "npu ip", ["device 1 has no address", "Get ip failed"],
     ["hccn_tool -i 1 -ip -s address"]),
    ("unhealthy", {0: OK[:2] + ("net health status: Init",)}, "npu health", ["device 0 net_health Init"], ["-netdetect -g"]),
]


@pytest.mark.parametrize("case,change,check,detail,fix", ROWS, ids=[r[0] for r in ROWS])
def test_a_bad_port_is_named_by_device_with_its_fix(case, change, check, detail, fix):
    net = npunet.parse_read(read_text({0: OK, 1: OK} | change))
    ok, text, how = verdicts(net)[check]
    assert not ok
    for w in detail:
        assert w in text
    for w in fix:
        assert w in how
    assert all(v[0] for name, v in verdicts(net).items() if name not in (check, "npu ping"))


def test_pings_name_the_peer_host_and_device():
    import dataclasses
    lost = npunet.ping_result(1, "192.168.101.2", "node1 (10.0.0.2) device 1", "recv time out seq=0")
    net = dataclasses.replace(healthy(), pings=(npunet.ping_result(0, "192.168.100.2", "node1 (10.0.0.2) device 0",
                                                                   "3 packets transmitted, 3 received"), lost))
    ok, detail, fix = verdicts(net)["npu ping"]
    assert not ok and detail == "device 1 -> node1 (10.0.0.2) device 1 192.168.101.2: recv time out"
    assert "hccn_tool -i 1 -ping -g address 192.168.101.2" in fix
    assert "npu ping" not in verdicts(net, multi=False)  # one host: nothing to ping


def test_no_tool_is_said_not_failed_and_a_peer_plan_uses_its_addresses():
    missing = npunet.parse_read("rlbox-hccn: none /usr/local/Ascend/driver/tools/hccn_tool\n")
    [(name, ok, detail, _)] = npunet.judge(missing, (0,), True)
    assert name == "npu network" and ok and "not checked" in detail
    peer = npunet.parse_read(read_text({0: OK}))
    assert npunet.ping_plan((0, 1), "node1 (h2)", peer) == [(0, "192.168.100.101", "node1 (h2) device 0")]
    assert npunet.ping_plan((0,), "node1 (h2)", missing) == []


def test_the_stand_in_answers_as_the_tool_and_fails_when_told(tmp_path: Path):
    folder = sim.write_stand_ins(tmp_path / "h2", "a2", 8, "25.3.rc1", host_index=2)
    tool = str(folder / "driver" / "tools" / "hccn_tool")
    out = subprocess.run(npunet.read_argv(tool, (0, 3)), capture_output=True, text=True).stdout
    net = npunet.parse_read(out)
    assert [(p.device, p.link, p.address, p.health) for p in net.ports] == [
        (0, "UP", "192.168.100.2", "Success"), (3, "UP", "192.168.103.2", "Success")]
    (folder / "hccn-standin.faults").write_text("link 3 DOWN\nunreachable 192.168.100.1\n")
    net = npunet.parse_read(subprocess.run(npunet.read_argv(tool, (0, 3)), capture_output=True, text=True).stdout)
    assert net.ports[1].link == "DOWN"
    text = subprocess.run(npunet.ping_argv(tool, [(0, "192.168.100.1"), (3, "192.168.103.1")]), capture_output=True, text=True).stdout
    pings = npunet.parse_pings(text, {})
    assert [(p.device, p.ok) for p in pings] == [(0, False), (3, False)]
