"""A testbed's record: ``ROOT/NAME/testbed.json``, written atomically here and read back through
a strict typed model, then held against what `rlbox testbed up` would have written for that name
and root: its own name and root, a subnet `up` accepts, the bridge, veths, namespaces, addresses
and folders derived from them, pids that could be a host's (never 1). Anything else is one line
naming the file and the field. The pids are only where to look: `execute` acts on a process only
when the process itself proves it is the testbed's (``trust``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlbox.core.errors import RlboxError
from rlbox.testbed import plan as tbplan


class HostState(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    index: int = Field(ge=1, le=tbplan.MAX_HOSTS)
    address: str = Field(max_length=15)
    netns: str = Field(max_length=15)
    veth: str = Field(max_length=15)
    dir: str = Field(max_length=260)
    devices: int = Field(ge=0, le=32)
    driver: str = Field(max_length=40)
    holder_pid: int | None = Field(None, ge=2)  # the `nsenter ... unshare --fork` process (root PID namespace)
    init_pid: int | None = Field(None, ge=2)  # PID 1 of the host's PID namespace, as this machine numbers it

    @property
    def socket(self) -> str:
        return f"{self.dir}/docker.sock"


class TestbedState(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    __test__ = False  # not a pytest class
    name: str = Field(max_length=5)
    root: str = Field(max_length=200)
    subnet: str = Field(max_length=18)
    bridge: str = Field(max_length=15)
    gateway: str = Field(max_length=15)
    hardware: Literal["a2", "a3", "ax"]
    image: str | None = Field(None, max_length=300, pattern=r"^[A-Za-z0-9][A-Za-z0-9./:@_-]*$")
    phase: Literal["starting", "up"]
    cluster_file: str = Field(max_length=260)
    identity_file: str = Field(max_length=260)
    known_hosts: str = Field(max_length=260)
    hosts: tuple[HostState, ...] = Field(min_length=1, max_length=tbplan.MAX_HOSTS)
    image_seconds: float | None = Field(None, ge=0)  # how long loading the image into every host took
    up_seconds: float | None = Field(None, ge=0)  # bring-up without the image

    @property
    def dir(self) -> str:
        return f"{self.root}/{self.name}"

    def host(self, index: int) -> HostState:
        for h in self.hosts:
            if h.index == index:
                return h
        raise RlboxError(f"testbed {self.name} has no host {index} (hosts 1..{len(self.hosts)})")

    def save(self) -> None:
        path = Path(self.dir) / "testbed.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=2))
        tmp.replace(path)


def path_for(root: str, name: str) -> Path:
    return Path(root) / name / "testbed.json"


def load(root: str, name: str) -> TestbedState:
    path = path_for(root, name)
    if not path.is_file():
        raise RlboxError(f"no testbed '{name}' under {root} (rlbox testbed up --name {name} ...)")
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        raise RlboxError(f"{path}: cannot read it ({err.strerror})") from None
    return parse(text, path, root, name)


def advice(root: str, name: str) -> str:
    return (f"not what `rlbox testbed up` writes; `rlbox testbed down --name {name} --root {root}` removes only "
            f"what it finds is testbed {name}'s")


def parse(text: str, path: Path | str, root: str, name: str) -> TestbedState:
    """The record of testbed ``name`` under ``root``, or one line naming the file and the field."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else str(err).splitlines()[0][:120]
        raise RlboxError(f"{path}: not a testbed record (not JSON: {why}); {advice(root, name)}") from None
    if not isinstance(data, dict):
        raise RlboxError(f"{path}: not a testbed record (a JSON {type(data).__name__}, not an object); "
                         f"{advice(root, name)}")
    try:
        state = TestbedState.model_validate(data)
    except (ValidationError, RecursionError) as err:
        if isinstance(err, RecursionError):
            raise RlboxError(f"{path}: nested too deeply; {advice(root, name)}") from None
        e = err.errors()[0]
        where = ".".join(str(p) for p in e["loc"]) or "(top)"
        raise RlboxError(f"{path}: {where}: {e['msg'][:160]}; {advice(root, name)}") from None
    wrong = mismatch(state, root, name)
    if wrong:
        field, why = wrong
        raise RlboxError(f"{path}: {field}: {why}; {advice(root, name)}")
    return state


def mismatch(state: TestbedState, root: str, name: str) -> tuple[str, str] | None:
    """The first field of ``state`` that `rlbox testbed up --name NAME --root ROOT` would not have
    written, as (field, why); None when every field is what it would have written."""
    root = root.rstrip("/")
    if state.name != name:
        return "name", f"{state.name[:40]!r}, not this testbed's name {name!r}"
    if state.root != root:
        return "root", f"{state.root[:80]!r}, not this testbed's root {root!r}"
    try:
        tbplan.check_subnet(state.subnet, "subnet")
    except RlboxError as err:
        return "subnet", str(err)
    if [h.index for h in state.hosts] != list(range(1, len(state.hosts) + 1)):
        return "hosts", "host indices are not 1..N in order"
    try:
        plan = tbplan.plan_testbed(hosts=len(state.hosts), hardware=state.hardware, name=name, subnet=state.subnet,
                                   root=root)
    except RlboxError as err:
        return "root", str(err)
    expected = [("bridge", state.bridge, plan.bridge), ("gateway", state.gateway, plan.gateway),
                ("cluster_file", state.cluster_file, plan.cluster_file),
                ("identity_file", state.identity_file, plan.identity_file),
                ("known_hosts", state.known_hosts, plan.known_hosts)]
    for i, (h, p) in enumerate(zip(state.hosts, plan.hosts)):
        expected += [(f"hosts.{i}.{f}", getattr(h, f), getattr(p, f)) for f in ("address", "netns", "veth", "dir")]
    for field, got, want in expected:
        if got != want:
            return field, f"{got[:80]!r}, not {want!r}"
    for i, h in enumerate(state.hosts):
        try:
            tbplan.check_driver(h.driver, h.driver[:40])
        except RlboxError as err:
            return f"hosts.{i}.driver", str(err)
        if h.holder_pid is not None and h.holder_pid == h.init_pid:
            return f"hosts.{i}.init_pid", "the same pid as holder_pid"
    return None
