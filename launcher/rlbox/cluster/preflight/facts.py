"""What `rlbox doctor` reads on one node, as plain values (``NodeFacts``); `doctor.judge` decides.

A node's host is read through two thin channels: its Docker engine (docker-py, local or over
the ssh tunnel) and short commands run on the host (locally, or ``ssh host -- argv``). On a
simulated host the NPU-specific facts (device nodes, npu-smi, the driver's version.info) are
read from its stand-in folder instead of the machine's /dev and /usr/local/Ascend; everything
else (ports, limits, shared memory, disk, image, paths) is the machine's own.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from rlbox.cluster.hosts import Node, ssh_argv
from rlbox.cluster.plan import LABEL_HOST, LABEL_RUN, NodePlan, RunPlan
from rlbox.cluster.preflight import npunet
from rlbox.core import npu

# Mount targets that are the host's driver files, not the run's model/data/checkpoints.
DRIVER_TARGETS = ("/usr/local/Ascend/driver", "/usr/local/dcmi", "/usr/local/bin/npu-smi", "/etc/ascend_install.info")


@dataclass(frozen=True)
class NodeFacts:
    """Everything one node's checks need. ``engine_error`` (the engine could not be reached) or
    ``inspect_error`` (a command on the host failed to run) leave the rest unread."""

    engine_error: str | None = None  # why connecting to the node's engine failed (the RlboxError's text)
    inspect_error: str | None = None  # why reading the host failed (an OSError or subprocess error)
    engine_version: str | None = None  # the engine's ServerVersion
    transport: str = "local"  # local | ssh
    devices: tuple[str, ...] = ()  # davinciN device nodes, sorted by name
    npu_smi: str = ""  # what `npu-smi info` printed
    npu_smi_error: str | None = None  # why it printed nothing usable ("" if it did not say)
    driver: str | None = None  # the driver's version.info version; None if missing
    npu_holders: tuple[tuple[str, str | None], ...] = ()  # containers holding this node's NPUs: (name, run label)
    live_runs: tuple[str, ...] = ()  # other rlbox runs with a running node container on this host
    listening: frozenset[int] = frozenset()  # TCP ports listening on the host
    ray_processes: tuple[str, ...] | None = None  # pids of raylet/gcs_server; None: not looked for (--replace)
    own_run_live: bool = False  # a container of the run being started runs here (what --replace takes over)
    nofile_hard: str = ""  # `ulimit -Hn`: a number, "unlimited", or "" if it printed nothing
    shm_kib: int | None = None  # size of /dev/shm
    route: str | None = None  # `ip -o route get HEAD`; None: not asked (simulated network or a given NIC)
    docker_root: str = "/var/lib/docker"
    disk_free_kib: int | None = None  # available under docker_root
    image: str = "absent"  # present | pullable | absent
    image_size: int = 0  # bytes, when present
    missing_mounts: tuple[str, ...] = ()  # mount sources (not the driver's) that do not exist on the host
    npu_net: npunet.NpuNet | None = None  # the NPUs' RoCE ports as hccn_tool reports them (None: not read)


@dataclass
class HostView:
    """What one node's host offers to the checks."""

    node_plan: NodePlan
    node: Node
    stand_ins: Path | None  # a simulated host's folder
    fetched: dict[tuple[str, ...], subprocess.CompletedProcess] = field(default_factory=dict)

    @property
    def host(self):
        return self.node_plan.host

    @property
    def remote(self) -> bool:
        return not self.host.local and self.stand_ins is None

    def run(self, argv: list[str], timeout: float = 15) -> subprocess.CompletedProcess:
        if tuple(argv) in self.fetched:
            return self.fetched[tuple(argv)]
        if not self.remote:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if self._on_agent([argv], timeout):
            return self.fetched[tuple(argv)]
        return subprocess.run(ssh_argv(self.host, command=[shlex.join(argv)]),
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def prefetch(self, commands: list[list[str]], timeout: float = 30) -> None:
        """Run every command on a remote host at once, over the shell the engine tunnel's session
        carries (rlbox.cluster.agent), else in one ssh session of its own (one connection instead of
        one per command: each costs a handshake); `run` then answers from what they printed."""
        if not self.remote or not commands:
            return
        if self._on_agent(commands, timeout + 2 * len(commands)):
            return
        proc = subprocess.run(ssh_argv(self.host, command=[batch_script(commands)]), capture_output=True, text=True,
                              timeout=timeout + 2 * len(commands), stdin=subprocess.DEVNULL)
        if proc.returncode == 255:  # ssh itself failed
            last = (proc.stderr.strip().splitlines() or ["ssh failed"])[-1]
            raise subprocess.SubprocessError(f"ssh {self.host.name}: {last}")
        self.fetched.update(batch_results(commands, proc.stdout))

    def _on_agent(self, commands: list[list[str]], timeout: float) -> bool:
        """``commands`` run on the tunnel's shell, their results kept; False when there is none. A shell
        that stops answering raises (its host is in trouble: a second session would wait as long)."""
        shell = self.node.agent
        if shell is None or shell.broken:
            return False
        _, out = shell.run(batch_script(commands), timeout)
        results = batch_results(commands, out)
        for argv in commands:  # a command the script never reached (mktemp failed) fails as ssh would
            results.setdefault(tuple(argv), subprocess.CompletedProcess(argv, 255, "", out.strip()[-200:]))
        self.fetched.update(results)
        return True

    def devices(self) -> tuple[str, ...]:
        if self.stand_ins is not None:
            names = [p.name for p in (self.stand_ins / "dev").iterdir()]
        else:
            proc = self.run(["ls", "-1", "/dev"])
            names = proc.stdout.split()
        return tuple(sorted(n for n in names if re.fullmatch(r"davinci\d+", n)))

    def npu_smi(self) -> tuple[str, str | None]:
        """(what `npu-smi info` printed, None) or ("", why it failed)."""
        if self.stand_ins is not None:
            argv = [str(self.stand_ins / "npu-smi"), "info"]
        else:
            argv = npu.npu_smi_argv() if self.host.local else ["npu-smi", "info"]
        try:
            proc = self.run(argv)
        except (OSError, subprocess.TimeoutExpired) as err:
            return "", str(err)
        if proc.returncode != 0:
            return "", (proc.stderr or proc.stdout).strip()[:200]
        if proc.stdout.startswith("ERROR"):  # read as a failure, as doctor always has
            return "", proc.stdout[6:]
        return proc.stdout, None

    def hccn_tool(self) -> str:
        """The hccn_tool to run: a simulated host's stand-in, else "" (the host's own, found there)."""
        return str(self.stand_ins / "driver" / "tools" / "hccn_tool") if self.stand_ins is not None else ""

    def npu_net(self, devices: tuple[int, ...]) -> npunet.NpuNet:
        proc = self.run(npunet.read_argv(self.hccn_tool(), devices), timeout=60)
        return npunet.parse_read(proc.stdout)

    def driver_version(self) -> str | None:
        if self.stand_ins is not None:
            path = self.stand_ins / "driver" / "version.info"
            text = path.read_text() if path.is_file() else ""
        else:
            text = self.run(["cat", "/usr/local/Ascend/driver/version.info"]).stdout
        return npu.driver_version(text)


def gather(node_plan: NodePlan, node: Node, stand_ins: Path | None, plan: RunPlan, replace: bool) -> NodeFacts:
    """Read one node's facts; a command that cannot run on the host becomes ``inspect_error``.
    Docker errors other than a missing image propagate."""
    try:
        return _read(HostView(node_plan, node, stand_ins), plan, replace)
    except (OSError, subprocess.SubprocessError) as err:
        return NodeFacts(inspect_error=str(err))


_MARK = "\x1e"


def batch_script(commands: list[list[str]]) -> str:
    """One sh script running each command (argv, quoted: data, never shell) and printing, per
    command, a marker with its index, its stdout, a marker with its exit code, its stderr. Only
    stderr waits in a file, and is read by `cat` only when there is some: a pre-flight runs ~11
    commands a host, and two `cat`s each cost 16 testbed hosts ~0.5 CPU-seconds."""
    lines = ['t=$(mktemp -d) || exit 1', 'trap \'rm -rf "$t"\' EXIT']
    for i, argv in enumerate(commands):
        lines.append(f"printf '\\036%s\\n' {i}; {{ {shlex.join(argv)}; }} 2>\"$t/e\" </dev/null; rc=$?; "
                     f"printf '\\036%s e\\n' $rc; [ ! -s \"$t/e\" ] || cat \"$t/e\"")
    return "\n".join(lines)


def batch_results(commands: list[list[str]], stdout: str) -> dict[tuple[str, ...], subprocess.CompletedProcess]:
    """What batch_script printed, per command; a command it never reached is left out."""
    out: dict[tuple[str, ...], subprocess.CompletedProcess] = {}
    parts = stdout.split(_MARK)[1:]
    for head, tail in zip(parts[0::2], parts[1::2]):
        index, _, text = head.partition("\n")
        first, _, err = tail.partition("\n")
        rc, _, kind = first.partition(" ")
        if not (index.isdigit() and kind == "e" and rc.lstrip("-").isdigit() and int(index) < len(commands)):
            continue
        argv = commands[int(index)]
        out[tuple(argv)] = subprocess.CompletedProcess(argv, int(rc), text, err)
    return out


def _read(view: HostView, plan: RunPlan, replace: bool) -> NodeFacts:
    from docker.errors import APIError, ImageNotFound

    node_plan = view.node_plan
    client = view.node.client
    info = client.info()
    npu_ids = node_plan.npu_ids or tuple(range(node_plan.npus))
    view.prefetch([npunet.read_argv(view.hccn_tool(), npu_ids), ["ls", "-1", "/dev"], ["npu-smi", "info"], ["cat", "/usr/local/Ascend/driver/version.info"],
                   ["ss", "-Hltn"], RAY_PROCESSES, ["sh", "-c", "ulimit -Hn"],
                   ["df", "-Pk", "/dev/shm"], ["ip", "-o", "route", "get", plan.head],
                   ["df", "-Pk", info.get("DockerRootDir", "/var/lib/docker")],
                   *(["test", "-e", m.source] for m in node_plan.container.mounts if not m.target.startswith(DRIVER_TARGETS))])
    devices = view.devices()
    table, table_error = view.npu_smi()
    driver = view.driver_version()
    net = view.npu_net(npu_ids)

    # the ports first, then the containers: a port taken by a node being started is seen with that node
    listening = listening_ports(view.run(["ss", "-Hltn"]).stdout)
    holders, live_runs, own_run_live = [], set(), False
    mine = {f"/dev/davinci{i}" for i in node_plan.npu_ids} or None
    # running containers, and rlbox nodes being started: the engine publishes a node's ports before it calls
    # the node running, so a run starting now must be seen by its NPUs too, not by its ports alone
    alive = {"status": ["created", "running", "restarting", "paused"]}  # exited ones are not read at all
    for box in client.containers.list(all=True, ignore_removed=True, filters=alive):
        run = box.labels.get(LABEL_RUN)
        host = box.labels.get(LABEL_HOST)
        if box.attrs.get("State", {}).get("Status") == "created" and not (run and host):
            continue  # a container made and never started holds nothing, unless it is an rlbox node starting
        if run and run != plan.run:  # its Ray processes are visible from this host, and not stale
            live_runs.add(run)
        own_run_live = own_run_live or run == plan.run
        devs = box.attrs.get("HostConfig", {}).get("Devices") or []
        if view.stand_ins is not None and host != node_plan.host.name and (
                host is not None or (run and all(d.get("PathOnHost") == "/dev/null" for d in devs))):
            continue  # simulated hosts share this engine: another (or an unnamed) simulated host's node
        mapped = {d.get("PathInContainer", "") for d in box.attrs.get("HostConfig", {}).get("Devices") or []}
        npus = {d for d in mapped if d.startswith("/dev/davinci") and d[12:].isdigit()}
        if npus and (mine is None or npus & mine):  # runs on other NPUs of the host are neighbours
            holders.append((box.name, run))

    ray = None
    if not replace:
        ray = tuple(view.run(RAY_PROCESSES).stdout.split())
    hard = view.run(["sh", "-c", "ulimit -Hn"]).stdout.strip()
    shm = df_kib(view.run(["df", "-Pk", "/dev/shm"]).stdout)
    route = None
    if not plan.network and not node_plan.host.nic:
        route = view.run(["ip", "-o", "route", "get", plan.head]).stdout

    root = info.get("DockerRootDir", "/var/lib/docker")
    free = df_kib(view.run(["df", "-Pk", root]).stdout, available=True)
    size = 0
    try:
        size = client.images.get(plan.image).attrs.get("Size", 0)
        image = "present"
    except ImageNotFound:
        try:
            client.images.get_registry_data(plan.image)
            image = "pullable"
        except APIError:
            image = "absent"

    missing = tuple(m.source for m in node_plan.container.mounts
                    if not m.target.startswith(DRIVER_TARGETS) and view.run(["test", "-e", m.source]).returncode != 0)
    return NodeFacts(
        engine_version=info.get("ServerVersion"), transport="local" if view.host.local else "ssh",
        devices=devices, npu_smi=table, npu_smi_error=table_error, driver=driver, npu_holders=tuple(holders), live_runs=tuple(sorted(live_runs)),
        listening=listening, ray_processes=ray, own_run_live=own_run_live, nofile_hard=hard, shm_kib=shm, route=route,
        docker_root=root, disk_free_kib=free, image=image, image_size=size, missing_mounts=missing, npu_net=net,
    )


def ping_peers(view: "HostView", net: npunet.NpuNet, pairs: list[tuple[int, str, str]]) -> npunet.NpuNet:
    """The second round on one host: its NPUs ping the next host's (``npunet.ping_plan``)."""
    from dataclasses import replace

    if net.tool is None or not pairs:
        return replace(net, pings=None)
    try:
        proc = view.run(npunet.ping_argv(net.tool, [(d, a) for d, a, _ in pairs]), timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return replace(net, ping_error=str(err)[:200])
    if view.remote and proc.returncode == 255:
        return replace(net, ping_error=(proc.stderr.strip().splitlines() or ["ssh failed"])[-1][:200])
    return replace(net, pings=npunet.parse_pings(proc.stdout, {(d, a): who for d, a, who in pairs}))


# Ray's own processes on this host's network: by executable name (the kernel's comm, matched whole),
# never by words on a command line (`tail -f raylet.out` or a run named ...raylet... is no Ray), and in
# the network namespace the check runs in, which is the one rlbox's nodes share (`--network host`): a
# Ray in another namespace (a bridged container, another testbed host on this machine) can neither hold
# this run's ports nor join its cluster. A process whose namespace cannot be read (another user's, for a
# user without the right to look) is counted: unknown is not "not stale". Fixed text, no user data.
RAY_PROCESSES = ["sh", "-c", 'me=$(readlink /proc/self/ns/net); for p in $(pgrep -x "raylet|gcs_server" 2>/dev/null); do '
                 'ns=$(readlink "/proc/$p/ns/net" 2>/dev/null); if [ -n "$ns" ]; then [ "$ns" = "$me" ] && echo "$p"; '
                 'elif [ -d "/proc/$p" ]; then echo "$p"; fi; done; true']


def listening_ports(ss_output: str) -> frozenset[int]:
    """The local ports of `ss -Hltn` lines."""
    ports = set()
    for line in ss_output.splitlines():
        cols = line.split()
        if len(cols) > 3 and cols[3].rsplit(":", 1)[-1].isdigit():
            ports.add(int(cols[3].rsplit(":", 1)[-1]))
    return frozenset(ports)


def df_kib(text: str, available: bool = False) -> int | None:
    """Size (or, ``available``, free space) in KiB from `df -Pk PATH`."""
    lines = text.strip().splitlines()
    if len(lines) < 2:
        return None
    cols = lines[-1].split()
    try:
        return int(cols[3] if available else cols[1])
    except (IndexError, ValueError):
        return None
