"""The cluster description: hosts (from --hosts, a hostfile or a cluster YAML), image, hardware.

Pure data and parsing; nothing here connects to a host.

Cluster YAML::

    image: verl_pt27_25rc3:a3-arm      # RELEASE:VARIANT from the matrix, or a full image reference
    hardware: a3                       # a2 | a3 | ax | auto
    ssh: {user: root, port: 22, identity_file: ~/.ssh/id_ed25519}   # defaults for every host
    mounts: [/data:/data, /home:/home]                               # for every node
    nofile: 65536                      # open-files limit of the node containers (default 65536; --nofile wins)
    hosts:
      - host: 10.0.0.1                 # node 0 is the Ray head
        nic: enp189s0f0                # optional: socket interface (detected otherwise)
      - host: 10.0.0.2
        ssh: {user: ops, port: 2222}
        mounts: [/mnt/ckpt:/ckpt:ro]

A hostfile is one host per line (``user@host:port`` allowed, ``#`` comments).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from rlbox.core.config import CLUSTER_NODES, control_char, load_yaml, read_text, validate
from rlbox.core.errors import RlboxError
from rlbox.registry import reference

HARDWARE_CHOICES = ("a2", "a3", "ax", "auto")
LOCAL_NAMES = {"local", "localhost", "127.0.0.1", "::1"}
# A host name starts with a letter or digit (never `-`: ssh would read it as an option).
_HOST_RE = re.compile(r"^(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9._-]{0,31})@)?"
                      r"(?P<host>[A-Za-z0-9][A-Za-z0-9._-]{0,252}|\[[0-9a-fA-F:]+\])(?::(?P<port>[0-9]{1,5}))?$")
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,31}")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}|[0-9a-fA-F]*:[0-9a-fA-F:]+")
# An MPI/DeepSpeed hostfile may say how many slots a host has; nothing else may follow the host.
_HOSTFILE_EXTRA = re.compile(r"^(slots|max_slots|max-slots)=[0-9]+$")


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False

    @classmethod
    def parse(cls, text: str, where: str = "--mount") -> "Mount":
        parts = text.split(":")
        if len(parts) == 1:
            parts = [parts[0], parts[0]]
        if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
            raise RlboxError(f"{where}: '{text}' is not SRC[:DST][:ro]")
        mode = parts[2] if len(parts) == 3 else "rw"
        if mode not in ("ro", "rw"):
            raise RlboxError(f"{where}: '{text}': mode must be ro or rw")
        bad = control_char(text)
        if bad is not None:  # a newline in a mount is a new line of every plan and docker argument list
            raise RlboxError(f"{where}: {text[:80]!r}: control character U+{ord(bad):04X}; a mount is one line")
        for p in parts[:2]:
            if not p.startswith("/"):
                raise RlboxError(f"{where}: '{text}': paths must be absolute")
        return cls(parts[0], parts[1], mode == "ro")

    def spec(self) -> str:
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class SimHost:
    """How a simulated host differs from a healthy one of its hardware (rehearsing broken hosts)."""

    devices: int | None = None
    chip: str | None = None
    driver: str | None = None


@dataclass(frozen=True)
class Host:
    name: str
    ssh_user: str | None = None
    ssh_port: int | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    nic: str | None = None
    address: str | None = None
    mounts: tuple[Mount, ...] = ()
    transport: str = "auto"  # local | ssh | auto (local for localhost/this host without ssh settings)
    sim: SimHost = SimHost()
    env: tuple[tuple[str, str], ...] = ()  # this host's own container environment (after the release's policy)

    @classmethod
    def from_record(cls, record: dict, name_key: str = "host") -> "Host":
        """The host a saved record (a run's node, a server) names, reached as it was then."""
        return cls(name=check_name(record.get(name_key), "record"), ssh_user=record.get("ssh_user"), ssh_port=record.get("ssh_port"),
                   identity_file=record.get("identity_file"), known_hosts=record.get("known_hosts"),
                   transport=record.get("transport", "auto"))

    @property
    def local(self) -> bool:
        if self.transport != "auto":
            return self.transport == "local"
        if self.ssh_user or self.ssh_port or self.identity_file:
            return False
        return self.name in LOCAL_NAMES or self.name == socket.gethostname()


@dataclass(frozen=True)
class ClusterSpec:
    hosts: tuple[Host, ...]
    image: str | None = None
    hardware: str = "auto"
    mounts: tuple[Mount, ...] = ()
    source: str = "--hosts"
    nofile: int | None = None  # the open-files limit of the nodes' containers (the hosts' hard limit)
    slurm_login: str | None = None  # the cluster file's slurm.login: where Slurm's commands run (--backend slurm)
    slurm_partition: str | None = None

    @property
    def nodes(self) -> int:
        return len(self.hosts)


class _Ssh(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        # never `-oProxyCommand=...`: ssh would read a user starting with `-` as an option
        if v is not None and not _USER_RE.fullmatch(v):
            raise ValueError(f"{v[:60]!r} is not an ssh user (letters, digits, . _ -; not starting with - or .)")
        return v

    @field_validator("identity_file", "known_hosts")
    @classmethod
    def _file(cls, v: str | None) -> str | None:
        if v is not None and (control_char(v) or v.startswith("-")):
            raise ValueError(f"{v[:60]!r} is not a file path")
        return v

    @field_validator("identity_file")
    @classmethod
    def _regular(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).expanduser().is_file():
            raise ValueError(f"{v[:60]!r} is not a regular file (ssh -i needs the private key file)")
        return v


class _SimEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    devices: int | None = Field(None, ge=0)
    chip: str | None = None
    driver: str | None = None


class _HostEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str
    sim: _SimEntry = _SimEntry()
    address: str | None = None
    nic: str | None = None
    ssh: _Ssh = _Ssh()
    mounts: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        from rlbox.core.config import env_name_problem

        for key, value in v.items():
            problem = env_name_problem(key)
            if problem:
                raise ValueError(problem)
            if control_char(value) is not None:
                raise ValueError(f"{key}: a control character in its value; an environment value is one line")
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if not _HOST_RE.fullmatch(v):
            raise ValueError(f"{v!r} is not a host name or address (letters, digits, . _ -; not starting with -)")
        return v

    @field_validator("address", "nic")
    @classmethod
    def _word(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,252}", v):
            raise ValueError(f"{v!r} is not an address or interface name")
        return v


class _SlurmEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    login: str | None = None  # where sbatch/squeue/scancel run (over ssh, as the hosts); none: this machine
    partition: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")

    @field_validator("login")
    @classmethod
    def _login(cls, v: str | None) -> str | None:
        return None if v is None else _host_value(v)


class _ClusterFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    image: reference.ImageRef | None = None
    slurm: _SlurmEntry | None = None
    hardware: str = "auto"
    ssh: _Ssh = _Ssh()
    mounts: list[str] = Field(default_factory=list)
    nofile: int | None = Field(None, ge=1024, le=1 << 20)
    hosts: list[_HostEntry] = Field(min_length=1, max_length=CLUSTER_NODES)

    @field_validator("hardware")
    @classmethod
    def _hw(cls, v: str) -> str:
        if v not in HARDWARE_CHOICES:
            raise ValueError(f"'{v}' is not one of {', '.join(HARDWARE_CHOICES)}")
        return v


def check_name(name: str, where: str = "host") -> str:
    """A host name as rlbox passes it to ssh and docker: letters, digits, ``. _ -``, not
    starting with ``-``; or an IPv6 address."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise RlboxError(f"{where}: {name!r} is not a host name or address")
    return name


def _host_value(v: str) -> str:
    if not _NAME_RE.fullmatch(v):
        raise ValueError(f"{v[:60]!r} is not a host name or address (letters, digits, . _ -; not starting with -)")
    return v


# A host name as a record read back names it (state.json, a server's record): check_name's rule.
HostName = Annotated[str, AfterValidator(_host_value)]
SshUser = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,31}$")]


def parse_host(text: str, where: str = "--hosts") -> Host:
    m = _HOST_RE.fullmatch(text.strip())
    if not m:
        shown = repr(text) if control_char(text) else f"'{text}'"
        raise RlboxError(f"{where}: {shown} is not HOST, USER@HOST or USER@HOST:PORT (letters, digits, . _ -; "
                         "not starting with -)")
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 0 < port < 65536:
        raise RlboxError(f"{where}: '{text}': port {port} out of range")
    return Host(name=m["host"].strip("[]"), ssh_user=m["user"], ssh_port=port)


def from_hosts(text: str) -> ClusterSpec:
    names = [h.strip() for h in text.split(",") if h.strip()]
    if not names:
        raise RlboxError("--hosts: give at least one host, e.g. --hosts 10.0.0.1,10.0.0.2")
    if len(names) > CLUSTER_NODES:
        raise RlboxError(f"--hosts: {len(names)} hosts; a cluster has at most {CLUSTER_NODES} nodes")
    return _checked(ClusterSpec(tuple(parse_host(n) for n in names)))


def from_file(path: Path) -> ClusterSpec:
    """A cluster YAML (mapping with `hosts:`) or a plain hostfile (one host per line).

    A file whose every line is one host (``[user@]host[:port]``, optionally ``slots=N``) is a
    hostfile; anything else is read as YAML, strictly: a syntax error is a parse error at its
    line, and a file that is neither names its first line that is not a host."""
    text = read_text(path)
    lines = [(n, line.split("#", 1)[0].split()) for n, line in enumerate(text.splitlines(), 1)]
    lines = [(n, words) for n, words in lines if words]
    bad = next(((n, words) for n, words in lines
                if not _HOST_RE.fullmatch(words[0]) or not all(_HOSTFILE_EXTRA.fullmatch(w) for w in words[1:])), None)
    if bad is None:
        if not lines:
            raise RlboxError(f"{path}: no hosts in the hostfile")
        hosts = [parse_host(words[0], where=f"{path}:{n}") for n, words in lines]
        return _checked(ClusterSpec(tuple(hosts), source=str(path)))
    data = load_yaml(text, str(path))
    if isinstance(data, dict):
        return _from_yaml(path, data)
    n, words = bad
    raise RlboxError(f"{path}:{n}: {' '.join(words)[:80]!r} is not a host: a hostfile has one [user@]host[:port] "
                     "per line (optionally slots=N); a cluster YAML is a mapping with hosts:")


def _from_yaml(path: Path, data: dict[str, Any]) -> ClusterSpec:
    doc = validate(_ClusterFile, data, str(path))
    mounts = tuple(Mount.parse(m, f"{path}: mounts") for m in doc.mounts)
    hosts = []
    for i, entry in enumerate(doc.hosts):
        base = parse_host(entry.host, where=f"{path}: hosts.{i}.host")
        hosts.append(
            Host(
                name=base.name,
                ssh_user=entry.ssh.user or base.ssh_user or doc.ssh.user,
                ssh_port=entry.ssh.port or base.ssh_port or doc.ssh.port,
                identity_file=entry.ssh.identity_file or doc.ssh.identity_file,
                known_hosts=entry.ssh.known_hosts or doc.ssh.known_hosts,
                nic=entry.nic,
                address=entry.address,
                mounts=tuple(Mount.parse(m, f"{path}: hosts.{i}.mounts") for m in entry.mounts),
                sim=SimHost(**entry.sim.model_dump()),
                env=tuple(entry.env.items()),
            )
        )
    return _checked(ClusterSpec(tuple(hosts), image=doc.image, hardware=doc.hardware, mounts=mounts, source=str(path),
                                nofile=doc.nofile, slurm_login=doc.slurm.login if doc.slurm else None,
                                slurm_partition=doc.slurm.partition if doc.slurm else None))


def host_key(h: Host) -> tuple[str, int]:
    """What makes two host entries one machine: the name without case (DNS ignores it) and the
    ssh port, 22 when none is given (``h1`` and ``h1:22`` are one host)."""
    return h.name.lower().rstrip("."), h.ssh_port or 22


def _checked(spec: ClusterSpec) -> ClusterSpec:
    seen: dict[tuple[str, int], str] = {}
    for h in spec.hosts:
        key = host_key(h)
        if key in seen:
            same = "" if seen[key] == h.name else f" (as {seen[key]})"
            raise RlboxError(f"{spec.source}: host {h.name} is listed twice{same}; list each machine once")
        seen[key] = h.name
    return spec


def agree(spec: ClusterSpec, nodes: int | None) -> None:
    if nodes is not None and nodes != spec.nodes:
        raise RlboxError(
            f"--nodes {nodes} disagrees with {spec.source}, which lists {spec.nodes} host(s): "
            f"{', '.join(h.name for h in spec.hosts)}"
        )
