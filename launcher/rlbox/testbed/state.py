"""A testbed's record: ``ROOT/NAME/testbed.json``, written atomically here and read back through
a strict typed model (an unknown or missing field is an error naming the file)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlbox.core.errors import RlboxError


class HostState(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    index: int = Field(ge=1)
    address: str
    netns: str
    veth: str
    dir: str
    devices: int = Field(ge=0)
    driver: str
    holder_pid: int | None = None  # the `nsenter ... unshare --fork` process (root PID namespace)
    init_pid: int | None = None  # PID 1 of the host's PID namespace, as this machine numbers it

    @property
    def socket(self) -> str:
        return f"{self.dir}/docker.sock"


class TestbedState(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    __test__ = False  # not a pytest class
    name: str
    root: str
    subnet: str
    bridge: str
    gateway: str
    hardware: str
    image: str | None = None
    phase: str  # starting | up
    cluster_file: str
    identity_file: str
    known_hosts: str
    hosts: tuple[HostState, ...]
    image_seconds: float | None = None  # how long loading the image into every host took
    up_seconds: float | None = None  # bring-up without the image

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
        return TestbedState.model_validate(json.loads(path.read_text()))
    except ValueError as err:
        first = str(err).splitlines()
        if isinstance(err, ValidationError):
            e = err.errors()[0]
            where = ".".join(str(p) for p in e["loc"])
            raise RlboxError(f"{path}: {where}: {e['msg']}") from None
        raise RlboxError(f"{path}: not a testbed record ({first[0] if first else err})") from None
