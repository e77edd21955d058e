"""`rlbox doctor`: per-node pre-flight checks, run in parallel, each a ✓ or a ✗ with its fix.

A check reads the host through two thin channels: its Docker engine (docker-py, local or over
the ssh tunnel) and short commands run on the host (locally, or ``ssh host -- argv``). On a
simulated host the NPU-specific facts (device nodes, npu-smi, the driver's version.info) are
read from its stand-in folder instead of the machine's /dev and /usr/local/Ascend; everything
else (ports, limits, shared memory, disk, image, paths) is the machine's own.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlbox.core import npu
from rlbox.core.errors import RlboxError
from rlbox.cluster.hosts import Node, connect, on_every, ssh_base, ssh_target
from rlbox.cluster.plan import LABEL_RUN, NodePlan, RunPlan

SHM_MIN_GIB = 4
DISK_MIN_GIB = 20


@dataclass(frozen=True)
class Check:
    node: str
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.node}: {'✓' if self.ok else '✗'} {self.name}: {self.detail}" + (f" -> {self.fix}" if self.fix and not self.ok else "")


@dataclass
class HostView:
    """What one node's host offers to the checks."""

    node_plan: NodePlan
    node: Node | None
    stand_ins: Path | None  # a simulated host's folder

    @property
    def host(self):
        return self.node_plan.host

    def run(self, argv: list[str], timeout: float = 15) -> subprocess.CompletedProcess:
        if self.host.local or self.stand_ins is not None:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return subprocess.run([*ssh_base(self.host), ssh_target(self.host), "--", shlex.join(argv)],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def devices(self) -> list[str]:
        if self.stand_ins is not None:
            names = [p.name for p in (self.stand_ins / "dev").iterdir()]
        else:
            proc = self.run(["ls", "-1", "/dev"])
            names = proc.stdout.split()
        return sorted(n for n in names if re.fullmatch(r"davinci\d+", n))

    def npu_smi(self) -> str:
        if self.stand_ins is not None:
            argv = [str(self.stand_ins / "npu-smi"), "info"]
        else:
            argv = npu.npu_smi_argv() if self.host.local else ["npu-smi", "info"]
        try:
            proc = self.run(argv)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"ERROR {err}"
        return proc.stdout if proc.returncode == 0 else f"ERROR {(proc.stderr or proc.stdout).strip()[:200]}"

    def driver_version(self) -> str | None:
        if self.stand_ins is not None:
            path = self.stand_ins / "driver" / "version.info"
            text = path.read_text() if path.is_file() else ""
        else:
            text = self.run(["cat", "/usr/local/Ascend/driver/version.info"]).stdout
        return npu.driver_version(text)


def _checks(view: HostView, plan: RunPlan, replace: bool) -> list[Check]:
    node_plan = view.node_plan
    label = node_plan.label
    driver_min, device_counts = plan.driver_min, plan.device_counts
    out: list[Check] = []

    def add(name, ok, detail, fix=""):
        out.append(Check(label, name, bool(ok), detail, fix))

    # Engine
    if view.node is None:
        return out
    client = view.node.client
    info = client.info()
    add("engine", True, f"Docker {info.get('ServerVersion')} ({'local' if view.host.local else 'ssh'})")

    # Device nodes
    devs = view.devices()
    want = node_plan.npus
    ok = len(devs) in device_counts and len(devs) >= want
    add("devices", ok, f"{len(devs)} /dev/davinci* (plan: {want}; {plan.hardware} hosts have {'/'.join(map(str, device_counts))})",
        "a device is missing or the driver is not loaded: check `npu-smi info` and dmesg")

    # Chip
    table = view.npu_smi()
    if table.startswith("ERROR"):
        add("npu-smi", False, table[6:] or "npu-smi failed", "install the driver's npu-smi at /usr/local/bin/npu-smi")
    else:
        chip = npu.chip_name(table) or "unknown"
        seen_hw = npu.chip_hardware(chip)
        fits = seen_hw == plan.hardware or (seen_hw == "a2" and plan.hardware == "ax")
        add("chip", fits, f"npu-smi reports {chip} ({(seen_hw or '?').upper()}); image hardware {plan.hardware}",
            f"use the {seen_hw} variant of the image (rlbox images list)" if seen_hw else "unknown chip")

    # Driver
    version = view.driver_version()
    driver_max = plan.driver_max
    if driver_min and driver_min != "none":
        ok = version is not None and npu.driver_key(version) >= npu.driver_key(driver_min)
        too_new = ok and driver_max is not None and npu.driver_key(version) > npu.driver_key(driver_max)
        bounds = f">= {driver_min}" + (f" and <= {driver_max}" if driver_max else "")
        add("driver", ok and not too_new, f"version.info {version or 'missing'}; the image's CANN needs {bounds}",
            f"install an Ascend driver (HDK) {bounds}, or use an image built for this driver")
    else:
        add("driver", version is not None, f"version.info {version or 'missing'}", "install the Ascend driver")

    # Devices held by another container
    holders = []
    for box in client.containers.list():
        if box.labels.get(LABEL_RUN) == plan.run and replace:
            continue
        devices = box.attrs.get("HostConfig", {}).get("Devices") or []
        if any(d.get("PathInContainer", "").startswith("/dev/davinci") and d.get("PathInContainer", "")[12:].isdigit()
               for d in devices):
            holders.append(box.name)
    add("devices free", not holders, "held by " + ", ".join(holders) if holders else "no other container holds NPUs",
        f"stop them (docker rm -f {' '.join(holders)}) or `rlbox stop --name RUN`" if holders else "")

    # Ports of this run
    ports = plan.ports.as_dict()
    wanted = {v: k for k, v in ports.items() if isinstance(v, int)}
    listening = set()
    for line in view.run(["ss", "-Hltn"]).stdout.splitlines():
        cols = line.split()
        if len(cols) > 3 and cols[3].rsplit(":", 1)[-1].isdigit():
            listening.add(int(cols[3].rsplit(":", 1)[-1]))
    taken = sorted(p for p in wanted if p in listening)
    add("ports", not taken, f"{len(wanted)} Ray ports of run {plan.run} free" if not taken else
        "taken: " + ", ".join(f"{p} ({wanted[p]})" for p in taken),
        f"find the owner: ss -ltnp 'sport = :{taken[0]}'; or use another --name" if taken else "")

    # Stale Ray
    if replace:
        add("stale ray", True, "not checked: --replace removes this run's Ray first")
    else:
        stale = view.run(["pgrep", "-f", "[r]aylet|[g]cs_server"]).stdout.split()  # the brackets keep concurrent pgreps from matching each other
        add("stale ray", not stale, f"{len(stale)} Ray process(es) running" if stale else "no Ray running",
            "a previous cluster is alive: `rlbox status` / `rlbox stop --name RUN`, or `ray stop` where it runs")

    # Limits and shared memory
    proc = view.run(["sh", "-c", "ulimit -Hn"])
    hard = proc.stdout.strip()
    need = dict((n, soft) for n, soft, _ in node_plan.container.ulimits).get("nofile", 0)
    ok = hard == "unlimited" or (hard.isdigit() and int(hard) >= need)
    add("nofile", ok, f"hard limit {hard or '?'}, the node asks {need}", f"raise it (limits.conf) or pass --nofile {hard}")
    proc = view.run(["df", "-Pk", "/dev/shm"])
    shm = _df_kib(proc.stdout)
    add("shm", shm is not None and shm >= SHM_MIN_GIB * 2**20, f"/dev/shm {(shm or 0) / 2**20:.1f} GiB (shared with --ipc host)",
        f"mount /dev/shm with at least {SHM_MIN_GIB} GiB")

    # Socket interface towards the head
    if plan.network:
        add("interface", True, f"eth0 on {plan.network.name} (simulated network)")
    elif node_plan.host.nic:
        add("interface", True, f"{node_plan.host.nic} (given)")
    else:
        proc = view.run(["ip", "-o", "route", "get", plan.head])
        m = re.search(r"\bdev (\S+)", proc.stdout)
        add("interface", bool(m), f"{m.group(1)} routes to the head {plan.head}" if m else f"no route to the head {plan.head}",
            "fix routing, or give the NIC with --nic / a host's nic:")

    # Disk for the image, the image itself
    root = info.get("DockerRootDir", "/var/lib/docker")
    proc = view.run(["df", "-Pk", root])
    free = _df_kib(proc.stdout, available=True)
    add("disk", free is not None and free >= DISK_MIN_GIB * 2**20, f"{(free or 0) / 2**20:.0f} GiB free for {root}",
        f"free space under {root} (docker system prune) for at least {DISK_MIN_GIB} GiB")
    from docker.errors import APIError, ImageNotFound

    try:
        img = client.images.get(plan.image)
        add("image", True, f"{plan.image} present ({img.attrs.get('Size', 0) / 1e9:.1f} GB)")
    except ImageNotFound:
        try:
            client.images.get_registry_data(plan.image)
            add("image", True, f"{plan.image} pullable")
        except APIError:
            add("image", False, f"{plan.image} neither present nor pullable", "docker pull it, or rlbox build it")

    # Model, data and checkpoint paths
    missing = []
    for m in node_plan.container.mounts:
        if m.target.startswith(("/usr/local/Ascend/driver", "/usr/local/dcmi", "/usr/local/bin/npu-smi", "/etc/ascend_install.info")):
            continue
        if view.run(["test", "-e", m.source]).returncode != 0:
            missing.append(m.source)
    add("paths", not missing, "missing: " + ", ".join(missing) if missing else
        f"{len(node_plan.container.mounts) - 4} mount source(s) present", "copy the model/data there, or fix --mount")
    return out


def _df_kib(text: str, available: bool = False) -> int | None:
    lines = text.strip().splitlines()
    if len(lines) < 2:
        return None
    cols = lines[-1].split()
    try:
        return int(cols[3] if available else cols[1])
    except (IndexError, ValueError):
        return None


def run_checks(plan: RunPlan, nodes: list[Node] | None = None, replace: bool = False) -> tuple[list[Check], float]:
    """Every check on every node, in parallel. ``nodes`` reuses open connections."""
    start = time.perf_counter()
    opened = []

    def one(index: int) -> list[Check]:
        node_plan = plan.nodes[index]
        label = node_plan.label
        node = nodes[index] if nodes else None
        if node is None:
            try:
                node = connect(node_plan.host)
                opened.append(node)
            except RlboxError as err:
                return [Check(label, "engine", False, str(err).split(": ", 1)[-1], "check the host, its ssh port and key, and dockerd")]
        stand_ins = Path(plan.sim_files) / node_plan.host.name if plan.sim_files else None
        try:
            return _checks(HostView(node_plan, node, stand_ins), plan, replace)
        except (OSError, subprocess.SubprocessError) as err:
            return [Check(label, "host", False, f"cannot inspect: {err}", "check ssh access to the host")]

    results, errors = on_every(one, list(range(len(plan.nodes))))
    for node in opened:
        node.close()
    if errors:
        raise errors[0]
    return [c for checks in results for c in checks], time.perf_counter() - start


def as_json(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]
