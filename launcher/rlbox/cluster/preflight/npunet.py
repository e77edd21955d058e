"""The NPU network in `rlbox doctor`: each NPU's own RoCE port, as the driver's ``hccn_tool`` sees it.

A2/A3 training traffic between hosts goes over each NPU's RoCE port (HCCL), not the host's
NIC; a port that is down, has no address, reports an unhealthy network or cannot reach the next
host's NPUs makes HCCL fail with socket timeouts (EI0006) minutes into a run. vllm-ascend's
multi-node guide asks for these checks by hand (``hccn_tool -i N -link -g``, ``-net_health -g``,
``/etc/hccn.conf``, pings between hosts); here they are read on every node and judged.

Three parts, as the rest of doctor: constant scripts that read (``READ_SCRIPT``, ``PING_SCRIPT``;
every value an argument, never shell text), parsers of what hccn_tool prints into ``NpuNet``
(plain values), and ``judge`` (pure) that turns them into checks naming host, device and fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Where the driver installs hccn_tool when it is not on the PATH.
DRIVER_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"
_MARK = "rlbox-hccn:"

# $1: the tool ("" = hccn_tool on the PATH, else the driver's); then the device ids.
READ_SCRIPT = r"""tool=$1; shift
[ -n "$tool" ] || tool=$(command -v hccn_tool || echo /usr/local/Ascend/driver/tools/hccn_tool)
[ -x "$tool" ] || { echo "rlbox-hccn: none $tool"; exit 0; }
echo "rlbox-hccn: tool $tool"
for i in "$@"; do
  echo "rlbox-hccn: $i link"; "$tool" -i "$i" -link -g 2>&1
  echo "rlbox-hccn: $i ip"; "$tool" -i "$i" -ip -g 2>&1
  echo "rlbox-hccn: $i health"; "$tool" -i "$i" -net_health -g 2>&1
done
"""

# $1: the tool path (as READ_SCRIPT found it); then pairs DEVICE ADDRESS, pinged all at once. The
# answers are printed in the pairs' order with the shell's own read (a `cat` an answer cost a 16-NPU
# host 32 processes; 16 testbed hosts at once ~0.5 CPU-seconds).
PING_SCRIPT = r"""tool=$1; shift
t=$(mktemp -d) || exit 1
trap 'rm -rf "$t"' EXIT
n=0 dev=
for a in "$@"; do
  if [ -z "$dev" ]; then dev=$a; continue; fi
  "$tool" -i "$dev" -ping -g address "$a" >"$t/$n" 2>&1 &
  n=$((n + 1)) dev=
done
wait
k=0 dev=
for a in "$@"; do
  if [ -z "$dev" ]; then dev=$a; continue; fi
  echo "rlbox-hccn: ping $dev $a"
  while IFS= read -r l || [ -n "$l" ]; do printf '%s\n' "$l"; done <"$t/$k"
  k=$((k + 1)) dev=
done
"""


def read_argv(tool: str, devices: tuple[int, ...]) -> list[str]:
    return ["sh", "-c", READ_SCRIPT, "rlbox-hccn", tool, *map(str, devices)]


def ping_argv(tool: str, pairs: list[tuple[int, str]]) -> list[str]:
    return ["sh", "-c", PING_SCRIPT, "rlbox-hccn", tool, *(w for d, a in pairs for w in (str(d), a))]


@dataclass(frozen=True)
class Port:
    """One NPU's RoCE port as hccn_tool reported it (None: it printed nothing usable)."""

    device: int
    link: str | None = None  # UP | DOWN | what else it said
    address: str | None = None
    netmask: str | None = None
    health: str | None = None  # Success | Init | Fault | ...
    said: str = ""  # the tool's own words when a query failed


@dataclass(frozen=True)
class Ping:
    device: int
    address: str  # the peer NPU's address
    peer: str  # "node1 (10.0.0.2) device 3"
    ok: bool
    detail: str  # "3/3 received" or "recv time out" or what the tool said


@dataclass(frozen=True)
class NpuNet:
    """What hccn_tool said on one host. ``tool`` None: no hccn_tool there (``missing`` says where
    it was looked for)."""

    tool: str | None = None
    missing: str = ""
    ports: tuple[Port, ...] = ()
    pings: tuple[Ping, ...] | None = None  # None: not pinged (one host, or no peer address)
    ping_error: str | None = None  # the ping round could not run on the host

    def address_of(self, device: int) -> str | None:
        return next((p.address for p in self.ports if p.device == device), None)


def parse_read(text: str) -> NpuNet:
    """``READ_SCRIPT``'s output into an NpuNet."""
    tool, missing = None, ""
    sections: dict[tuple[int, str], list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(_MARK):
            words = line[len(_MARK):].split()
            if words[:1] == ["none"]:
                missing = words[1] if len(words) > 1 else DRIVER_TOOL
            elif words[:1] == ["tool"]:
                tool = " ".join(words[1:])
            elif len(words) == 2 and words[0].isdigit():
                current = (int(words[0]), words[1])
                sections[current] = []
            continue
        if current is not None:
            sections[current].append(line)
    devices = sorted({d for d, _ in sections})
    ports = []
    for d in devices:
        link_text = "\n".join(sections.get((d, "link"), []))
        ip_text = "\n".join(sections.get((d, "ip"), []))
        health_text = "\n".join(sections.get((d, "health"), []))
        link = _value(r"link status\s*:\s*(\S+)", link_text)
        address = _value(r"ipaddr\s*:\s*([0-9.]+)", ip_text)
        netmask = _value(r"netmask\s*:\s*([0-9.]+)", ip_text)
        health = _value(r"net health status\s*:\s*(\S.*?)\s*$", health_text)
        said = next((t.strip() for t, v in ((link_text, link), (ip_text, address), (health_text, health))
                     if v is None and t.strip()), "")
        ports.append(Port(d, link.upper() if link else None, address, netmask, health, said[:120]))
    return NpuNet(tool=tool, missing=missing if tool is None else "", ports=tuple(ports))


def parse_pings(text: str, peers: dict[tuple[int, str], str]) -> tuple[Ping, ...]:
    """``PING_SCRIPT``'s output; ``peers`` names each (device, address) pinged."""
    out = []
    current, lines = None, []

    def close():
        if current is not None:
            out.append(ping_result(current[0], current[1], peers.get(current, current[1]), "\n".join(lines)))

    for line in text.splitlines():
        if line.startswith(_MARK + " ping "):
            close()
            words = line.split()
            current, lines = (int(words[2]), words[3]), []
        elif current is not None:
            lines.append(line)
    close()
    return tuple(out)


def ping_result(device: int, address: str, peer: str, text: str) -> Ping:
    """One ping's verdict from what ``hccn_tool -i N -ping -g address A`` printed."""
    m = re.search(r"(\d+) packets transmitted, (\d+) received", text)
    if m and int(m[1]) > 0 and m[1] == m[2]:
        return Ping(device, address, peer, True, f"{m[2]}/{m[1]} received")
    if m:
        detail = f"{m[2]}/{m[1]} received" + (" (recv time out)" if "recv time out" in text else "")
    elif "recv time out" in text:
        detail = "recv time out"
    else:
        detail = (text.strip().splitlines() or ["no answer from hccn_tool"])[-1][:120]
    return Ping(device, address, peer, False, detail)


def _value(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text, re.IGNORECASE | re.MULTILINE)
    return m.group(1) if m else None


def ping_plan(own: tuple[int, ...], peer_label: str, peer: NpuNet | None) -> list[tuple[int, str, str]]:
    """What one host pings: each of its NPUs the next host's NPU of the same id (HCCL's rings pair
    NPUs by id across hosts), at the address that host's hccn_tool gave. (device, address, who)."""
    if peer is None or peer.tool is None:
        return []
    out = []
    for d in own:
        address = peer.address_of(d)
        if address:
            out.append((d, address, f"{peer_label} device {d}"))
    return out


def _devices(items) -> str:
    return ", ".join(items)


def judge(net: NpuNet | None, devices: tuple[int, ...], multi_host: bool) -> list[tuple[str, bool, str, str]]:
    """The NPU network checks of one host as (name, ok, detail, fix): link, address, health, and,
    on a multi-host run, the pings to the next host."""
    if net is None:
        return []
    if net.tool is None:
        return [("npu network", True, f"not checked: no hccn_tool on the host (looked for it on the PATH and at "
                                      f"{net.missing or DRIVER_TOOL})", "")]
    ports = {p.device: p for p in net.ports}
    out = []
    down = [d for d in devices if (ports.get(d) or Port(d)).link != "UP"]
    out.append(("npu link", not down,
                f"{len(devices)} RoCE port(s) UP" if not down else
                _devices(f"device {d} {(ports.get(d) or Port(d)).link or 'unknown: ' + ((ports.get(d) or Port(d)).said or 'no answer')}" for d in down),
                f"check device {down[0]}'s optical module, cable and switch port (`hccn_tool -i {down[0]} -link -g`; "
                f"`hccn_tool -i {down[0]} -lldp -g` names the switch port)" if down else ""))
    noip = [d for d in devices if not (ports.get(d) or Port(d)).address]
    shown = [f"device {d} {ports[d].address}/{ports[d].netmask or '?'}" for d in devices if d in ports and ports[d].address]
    shown_text = ", ".join(shown) if len(shown) <= 3 else f"{shown[0]} .. {shown[-1]}"
    out.append(("npu ip", not noip, f"{len(shown)} address(es): {shown_text}" if not noip else
                _devices(f"device {d} has no address ({(ports.get(d) or Port(d)).said or 'no answer'})" for d in noip),
                f"give it one: `hccn_tool -i {noip[0]} -ip -s address ADDRESS netmask NETMASK` (and in /etc/hccn.conf)"
                if noip else ""))
    sick = [d for d in devices if ((ports.get(d) or Port(d)).health or "").lower() != "success"]
    out.append(("npu health", not sick, f"{len(devices)} port(s) net_health Success" if not sick else
                _devices(f"device {d} net_health {(ports.get(d) or Port(d)).health or 'unknown'}" for d in sick),
                f"`hccn_tool -i {sick[0]} -net_health -g`; check its detect address (`hccn_tool -i {sick[0]} -netdetect -g`) "
                "and gateway (`-gateway -g`) against /etc/hccn.conf" if sick else ""))
    if multi_host:
        if net.ping_error:
            out.append(("npu ping", False, f"could not ping: {net.ping_error}", "run `hccn_tool -i 0 -ping -g address PEER` on the host"))
        elif net.pings is None or not net.pings:
            out.append(("npu ping", True, "not pinged: the next host's NPUs gave no address (its own checks say why)", ""))
        else:
            bad = [p for p in net.pings if not p.ok]
            out.append(("npu ping", not bad,
                        f"{len(net.pings)} NPU(s) reach the next host's ({net.pings[0].peer.rsplit(' device', 1)[0]})" if not bad else
                        _devices(f"device {p.device} -> {p.peer} {p.address}: {p.detail}" for p in bad),
                        f"check both ports' links and that they share a subnet and a switch (`hccn_tool -i {bad[0].device} "
                        f"-ping -g address {bad[0].address}`)" if bad else ""))
    return out
