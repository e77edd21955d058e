"""The simulated cluster (`rlbox run --sim`): stand-ins for what an Ascend host provides.

Each simulated node is a container on the local engine, on a private Docker network with its
own address. What the host would mount into the training container is replaced by stand-ins
written here: a driver folder with ``version.info``, ``/etc/ascend_install.info``, an empty
``/usr/local/dcmi`` and an ``npu-smi`` that prints the table the real tool prints for the
simulated chip. Device nodes are mapped from ``/dev/null`` (see plan.node_container).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shutil
import tempfile
import time
from pathlib import Path

from rlbox.core.errors import RlboxError
from rlbox.cluster.plan import LABEL_MANAGED, LABEL_RUN, LABEL_RUN_ID, SimNetwork

# Name column of `npu-smi info`, chips per NPU id, and the PCI bus ids in the order real hosts
# print them (Atlas 800T A2: vllm-ascend issue #198; Atlas 800T A3: issue #5825).
CHIPS = {
    "a2": ("910B3", 1, ("C1", "C2", "81", "82", "01", "02", "41", "42")),
    "ax": ("910B3", 1, ("C1", "C2", "81", "82", "01", "02", "41", "42")),
    "a3": ("Ascend910", 2, ("9D", "9F", "99", "9B", "95", "97", "91", "93",
                            "8D", "8F", "89", "8B", "85", "87", "81", "83")),
}
_THIN = "+" + "-" * 27 + "+" + "-" * 15 + "+" + "-" * 52 + "+"
_THICK = "+" + "=" * 27 + "+" + "=" * 15 + "+" + "=" * 52 + "+"
_FULL = "+" + "-" * 96 + "+"


def npu_smi_table(hardware: str, devices: int, driver: str, chip_name: str | None = None) -> str:
    """What `npu-smi info` prints on an idle host of this hardware (the 98-column layout of
    npu-smi 23.x-25.x): one two-line block per chip, `Ascend910` with a Phy-ID column on A3."""
    name, chips_per_npu, buses = CHIPS[hardware]
    if chip_name and chip_name != name:  # a host whose chip is not what its profile says
        known = {v[0]: v for v in CHIPS.values()}
        name, chips_per_npu, buses = known.get(chip_name, (chip_name, 1, buses))
    a3 = chips_per_npu == 2
    lines = [
        _FULL,
        f"| npu-smi {driver:<24} Version: {driver:<53}|",
        _THIN,
        "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|",
        ("| Chip  Phy-ID              " if a3 else "| Chip                      ")
        + "| Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |",
        _THICK,
    ]
    npus = max(1, devices // chips_per_npu)
    for npu in range(npus):
        for chip in range(chips_per_npu):
            phy = npu * chips_per_npu + chip
            bus = f"0000:{buses[phy % len(buses)]}:00.0"
            power = "-" if chip == 1 else f"{92.5 + phy % 7:.1f}"
            lines.append(f"| {npu:<6}{name:<20}| {'OK':<14}| {power:<12}{36 + phy % 5:<18}{'0    / 0':<21}|")
            second = f"{chip:<6}{phy:<20}" if a3 else f"{chip:<26}"
            lines.append(f"| {second}| {bus:<14}| {'0':<12}{'0    / 0':<18}{'3338 / 65536':<21}|")
            lines.append(_FULL if a3 and chip == 0 else _THICK)
    lines += [_THIN, "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |", _THICK]
    for npu in range(npus):
        lines.append(f"| {'No running processes found in NPU ' + str(npu):<95}|")
        lines.append(_THICK)
    return "\n".join(lines) + "\n"


def write_stand_ins(folder: Path, hardware: str, devices: int, driver: str, chip: str | None = None,
                    host_index: int = 1) -> Path:
    """Write the host-side files a simulated host has: driver files, npu-smi, hccn_tool (in the
    driver's ``tools/``, with the host's ``hccn.conf``: NPU i at 192.168.(100+i).HOST_INDEX/24),
    and a ``dev/`` listing of its device nodes (what `rlbox doctor` reads instead of the host's /dev)."""
    if hardware not in CHIPS:
        raise RlboxError(f"--sim cannot simulate hardware '{hardware}'; choose a2, a3 or ax")
    folder.mkdir(parents=True, exist_ok=True)
    # Two starts of one run name at once (a racing --replace, a twin) write the same host's folder while
    # the other's pre-flight reads it: a file is put only when it differs, and atomically (renamed into
    # place), so a reader sees the old content or the new, never a gap or half a file.
    names = [f"davinci{i}" for i in range(devices)] + ["davinci_manager", "devmm_svm", "hisi_hdc"]
    _put_listing(folder / "dev", names)
    (folder / "driver" / "lib64").mkdir(parents=True, exist_ok=True)
    (folder / "dcmi").mkdir(exist_ok=True)
    _put(folder / "driver" / "version.info",
         f"Version={driver}\npackage_version={driver}\nascendhal_version=7.35.23\n"
         "# rlbox simulation: stand-in for the Ascend driver's version.info\n")
    _put(folder / "ascend_install.info",
         "UserName=HwHiAiUser\nUserGroup=HwHiAiUser\nDriver_Install_Type=full\n"
         "Driver_Install_Path_Param=/usr/local/Ascend\nDriver_Install_For_All=no\n")
    table = npu_smi_table(hardware, devices, driver, chip)
    _put(folder / "npu-smi",
         "#!/bin/sh\n# rlbox simulation: stand-in for npu-smi; prints what `npu-smi info` prints on this hardware.\n"
         'case "${1:-}" in\n'
         "  info|'') cat <<'EOF'\n" + table + "EOF\n  ;;\n"
         f"  -v|--version) echo 'npu-smi version: {driver}' ;;\n"
         "  *) echo \"npu-smi (rlbox simulation) supports only 'info'\" >&2; exit 1 ;;\n"
         "esac\n", mode=0o755)
    (folder / "driver" / "tools").mkdir(exist_ok=True)
    _put(folder / "driver" / "tools" / "hccn_tool", HCCN_TOOL, mode=0o755)
    _put(folder / "hccn.conf", "".join(
        f"address_{i}={npu_address(i, host_index)}\nnetmask_{i}=255.255.255.0\n" for i in range(devices)))
    return folder


def _put(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``path`` unless it holds ``text`` already: made aside, then renamed over it."""
    try:
        if path.read_text() == text and (path.stat().st_mode & 0o777) == mode:
            return
    except (OSError, UnicodeDecodeError):
        pass
    fd, made = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(made, mode)
    os.replace(made, path)


def _put_listing(dev: Path, names: list[str]) -> None:
    """A folder of empty files named ``names`` at ``dev`` (a host's /dev as the doctor lists it). Left
    alone when it lists them already; else made aside and swapped in through a symbolic link, the one
    kind of path a rename replaces in one step, so a reader never finds ``dev`` missing."""
    try:
        if sorted(p.name for p in dev.iterdir()) == sorted(names):
            return
    except OSError:
        pass
    made = Path(tempfile.mkdtemp(prefix=".dev-", dir=dev.parent))
    for name in names:
        (made / name).touch()
    link = dev.parent / f".{made.name}.link"
    link.symlink_to(made.name)
    if dev.is_symlink():  # the listing being replaced: its age from now on counts from its replacement
        try:
            os.utime(dev.resolve())
        except OSError:
            pass
    if dev.is_dir() and not dev.is_symlink():  # a listing from before links: no atomic way to replace a folder
        shutil.rmtree(dev, ignore_errors=True)
    os.replace(link, dev)
    # listings replaced a minute ago or more go: a reader may still be walking one replaced just now
    for old in dev.parent.glob(".dev-*"):
        try:
            if old != made and old.is_dir() and time.time() - old.stat().st_mtime > 60:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass


def npu_address(device: int, host_index: int) -> str:
    """The RoCE address a simulated host's NPU ``device`` has (its hccn.conf): one /24 per device
    index, the host's number as the last byte, as real clusters number them."""
    return f"192.168.{100 + device}.{host_index % 254 or 254}"


# A stand-in for the driver's hccn_tool (`hccn_tool -i N -link|-ip|-net_health -g`, `-ping -g
# address A`), printing what the real tool prints. Addresses come from the host's hccn.conf
# (/etc/hccn.conf, or hccn.conf two folders up for a --sim host's stand-in folder). It can be told
# to fail: lines of /etc/rlbox-hccn-standin.faults (or hccn-standin.faults beside hccn.conf):
#   link N DOWN | health N STATUS | noip N | unreachable ADDRESS
HCCN_TOOL = r"""#!/bin/sh
# rlbox stand-in for hccn_tool (the NPU RoCE port tool); see rlbox.cluster.sim.HCCN_TOOL
# Shell builtins only: the real tool is one process per query, and so is this one (a pre-flight
# queries each NPU three times; with sed, grep and dirname it cost ~0.3 s of CPU per 16-NPU host).
case $0 in */*) d=${0%/*} ;; *) d=. ;; esac
conf=/etc/hccn.conf faults=/etc/rlbox-hccn-standin.faults
if [ -f "$d/../../hccn.conf" ]; then conf=$d/../../hccn.conf faults=$d/../../hccn-standin.faults; fi
fault() {
  [ -f "$faults" ] || return 1
  while IFS= read -r l || [ -n "$l" ]; do [ "$l" = "$1" ] && return 0; done <"$faults"
  return 1
}
[ "${1:-}" = -i ] || { echo "hccn_tool (rlbox stand-in): use -i N -link|-ip|-net_health -g, -ping -g address A" >&2; exit 1; }
i=$2 what=${3:-}
addr= mask= k= v=
address() {  # this NPU's address and netmask from hccn.conf (read only by the queries that need them)
  if [ -r "$conf" ]; then
    while IFS='=' read -r k v || [ -n "$k" ]; do
      case $k in
        "address_$i") [ -n "$addr" ] || addr=$v ;;
        "netmask_$i") [ -n "$mask" ] || mask=$v ;;
      esac
    done <"$conf"
  fi
  fault "noip $i" && addr= mask=
  return 0
}
case $what in
  -link) if fault "link $i DOWN"; then echo "link status: DOWN"; else echo "link status: UP"; fi ;;
  -ip) address
       [ -n "$addr" ] || { echo "Get ip failed, ret:-2" >&2; exit 1; }
       echo "ipaddr:$addr"; echo "netmask:$mask" ;;
  -net_health) s=
       if [ -f "$faults" ]; then
         while IFS= read -r l || [ -n "$l" ]; do
           case $l in "health $i "*) [ -n "$s" ] || s=${l#"health $i "} ;; esac
         done <"$faults"
       fi
       echo "net health status: ${s:-Success}" ;;
  -ping) address; peer=${6:-}
       if fault "link $i DOWN" || fault "unreachable $peer" || [ -z "$addr" ]; then
         for n in 0 1 2; do echo "recv time out seq=$n"; done
         echo "3 packets transmitted, 0 received, 100.00% packet loss"
       else
         for n in 0 1 2; do echo "64 bytes from $peer: icmp_seq=$n ttl=64 time=0.1 ms"; done
         echo "3 packets transmitted, 3 received, 0.00% packet loss"
       fi ;;
  *) echo "hccn_tool (rlbox stand-in): $what not simulated" >&2; exit 1 ;;
esac
"""


def stand_in_count(devices: int | None, device_counts: tuple[int, ...], ids: tuple[int, ...]) -> int:
    """How many NPUs a simulated host's stand-in has, whichever a run takes (``ids``): its cluster entry's
    ``devices``, else the hardware's largest count (``device_counts``), or more when an id is beyond it."""
    return devices if devices is not None else max(max(device_counts or (len(ids),)), max(ids) + 1)


def write_hosts(plan) -> None:
    """Stand-ins for every simulated host of a plan, each as its cluster entry describes it."""
    for node in plan.nodes:  # a host has all its NPUs, whichever the run takes
        h = node.host.sim
        devices = stand_in_count(h.devices, plan.device_counts, node.npu_ids or tuple(range(node.npus)))
        write_stand_ins(Path(plan.sim_files) / node.host.name, plan.hardware, devices,
                        h.driver or plan.sim_driver, h.chip, host_index=node.index + 1)


def network_for(run: str) -> SimNetwork:
    """The run's private network; its subnet is taken when it is created (create_network)."""
    return SimNetwork(f"rlbox-{run}")


def _held_subnets(client) -> set[ipaddress.IPv4Network]:
    held = set()
    for net in client.networks.list():
        for pool in ((net.attrs.get("IPAM") or {}).get("Config") or []):
            try:
                held.add(ipaddress.ip_network(pool.get("Subnet", ""), strict=False))
            except ValueError:
                pass  # IPv6 or empty
    return held


def create_network(client, net: SimNetwork, run: str, run_id: str | None = None) -> str:
    """Create the run's network on the first /24 of 172.30.0.0/16 (starting at one chosen by
    the run's name) that no network of the engine holds; a subnet taken in between by another
    rlbox (the engine refuses an overlap) moves on to the next. Returns the subnet."""
    import docker
    from docker.errors import APIError

    start = int(hashlib.sha256(run.encode()).hexdigest(), 16) % 256
    held = _held_subnets(client)
    for k in range(256):
        subnet = ipaddress.ip_network(f"172.30.{(start + k) % 256}.0/24")
        if any(subnet.overlaps(h) for h in held):
            continue
        try:
            client.networks.create(
                net.name, driver="bridge", check_duplicate=True,
                ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=str(subnet))]),
                labels={LABEL_MANAGED: "true", LABEL_RUN: run, **({LABEL_RUN_ID: run_id} if run_id else {})},
            )
            return str(subnet)
        except APIError as err:
            reason = " ".join(str(err.explanation or err).split())
            if "overlap" in reason.lower():
                held.add(subnet)
                continue
            if err.status_code == 409 or "already exists" in reason:
                raise RlboxError(f"simulation network {net.name} already exists: another `rlbox run --name {run}` "
                                 f"is starting; stop it (rlbox stop --name {run}) or pick another --name") from None
            raise RlboxError(f"cannot create the simulation network {net.name}: {reason}") from None
    raise RlboxError("no free /24 left in 172.30.0.0/16 for a simulation network; remove unused networks "
                     "(docker network prune)")
