"""A running testbed for tests (`rlbox testbed up`): several real hosts on this machine, each with
its own address, Docker engine and sshd (see docs/testbed.md). Brought up through the real CLI,
taken down the same way, and proved empty afterwards.

    from support.testbed import Testbed
    with Testbed.up(hosts=2, hardware="a3", name="tbx", image=IMAGE) as bed:
        bed.cluster_file                 # for `rlbox run --cluster`
        bed.deliver(OTHER)               # `rlbox distribute OTHER` to every host; cluster files name it
        bed.socket(1)                    # unix socket of host 1's engine (docker -H unix://...)
        bed.docker(2, "ps", "-a")        # the docker CLI against host 2's engine
        bed.cluster(2, 1)                # a cluster file of hosts 2 and 1 (host 2 the head)

Faults only separate hosts have, each a context manager that puts the host back:
``engine_stopped(i)``, ``sshd_stopped(i)``, ``no_route_to(i, j)``, ``image_differs(i)``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROOT = "/var/lib/rlbox-testbed"


def problem() -> str | None:
    """Why a testbed cannot be made on this machine, or None."""
    if os.geteuid() != 0:
        return "the testbed needs root"
    for tool in ("ip", "nsenter", "unshare", "iptables", "dockerd", "ssh"):
        if shutil.which(tool) is None:
            return f"the testbed needs {tool}"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "no Docker engine on this machine"
    return None


def require() -> None:
    """Skip (fail under CI=true) where no testbed can be made. Under pytest-xdist, fail a test that is in
    no group (tests/conftest.py): beside another worker's test it would meet that test's testbed (ci of
    stop 46: the three tests of test_testbed_faults, unmarked, ran on two workers at once on one name)."""
    ungrouped = ungrouped_under_xdist(os.environ)
    if ungrouped:
        pytest.fail(ungrouped)
    why = problem()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"testbed test under CI=true but {why}")
        pytest.skip(why)


def ungrouped_under_xdist(env) -> str | None:
    """Why the running test may not make a testbed: under pytest-xdist (PYTEST_XDIST_WORKER) its id
    (PYTEST_CURRENT_TEST) has no ``@group`` (xdist's loadgroup adds it), or None."""
    if not env.get("PYTEST_XDIST_WORKER"):
        return None
    current = env.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    if "@" in current.rsplit("]", 1)[-1]:  # xdist appends "@group" after any parameters
        return None
    return (f"{current}: makes a testbed but is in no xdist group, so it may run beside another worker's "
            "testbed test; mark it (tests/conftest.py: engine, testbed)")


def rlbox(*args, check: bool = False, timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "rlbox.cli", *map(str, args)], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"rlbox {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


@dataclass
class Testbed:
    name: str
    root: str
    record: dict
    image: str | None = None  # the image every host holds, named by the cluster files ``cluster()`` writes
    __test__ = False

    # -- life -----------------------------------------------------------------------------------
    @classmethod
    def up(cls, *, hosts: int, hardware: str = "a3", name: str, image: str | None = None, root: str = ROOT,
           extra: tuple[str, ...] = ()) -> "Testbed":
        require()
        if Path(root, name, "testbed.json").exists():  # left by a killed session
            rlbox("testbed", "down", "--name", name, "--root", root)
        args = ["testbed", "up", "--hosts", hosts, "--hardware", hardware, "--name", name, "--root", root, *extra]
        if image:
            args += ["--image", image]
        rlbox(*args, check=True)
        return cls(name, root, json.loads(Path(root, name, "testbed.json").read_text()), image)

    def deliver(self, image: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        """`rlbox distribute IMAGE` to every host (one pipelined stream, layers they hold left out);
        the cluster files ``cluster()`` writes name it from then on."""
        proc = rlbox("distribute", image, "--cluster", self.cluster_file, check=True, timeout=timeout)
        self.image = image
        return proc

    def down(self) -> subprocess.CompletedProcess:
        return rlbox("testbed", "down", "--name", self.name, "--root", self.root)

    def __enter__(self) -> "Testbed":
        return self

    def __exit__(self, *exc) -> None:
        proc = self.down()
        assert proc.returncode == 0, proc.stderr[-2000:]

    # -- what tests use --------------------------------------------------------------------------
    @property
    def cluster_file(self) -> str:
        return self.record["cluster_file"]

    @property
    def hosts(self) -> list[dict]:
        return self.record["hosts"]

    def host(self, index: int) -> dict:
        return self.hosts[index - 1]

    def address(self, index: int) -> str:
        return self.host(index)["address"]

    def socket(self, index: int) -> str:
        return f"{self.host(index)['dir']}/docker.sock"

    def sockets(self) -> list[str]:
        return [self.socket(h["index"]) for h in self.hosts]

    def docker(self, index: int, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        proc = subprocess.run(["docker", "-H", f"unix://{self.socket(index)}", *args], capture_output=True, text=True, **kw)
        if check and proc.returncode != 0:
            raise AssertionError(f"docker on host {index}: {' '.join(args)}: {proc.stderr.strip()[-500:]}")
        return proc

    def ssh(self, index: int, *command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        r = self.record
        return subprocess.run(["ssh", "-i", r["identity_file"], "-o", f"UserKnownHostsFile={r['known_hosts']}",
                               "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "--",
                               f"root@{self.address(index)}", *command], capture_output=True, text=True, timeout=timeout)

    def cluster(self, *indices: int, path: Path | None = None) -> str:
        """A cluster file of some of the hosts, in this order (the first is the head), naming the
        image the hosts were given (``up(image=)`` or ``deliver``)."""
        lines = [line for line in Path(self.cluster_file).read_text().splitlines()
                 if not line.startswith(("  - host:", "image:", "hosts:"))]
        lines += [f"image: {self.image}"] if self.image else []
        lines += ["hosts:", *(f"  - host: {self.address(i)}" for i in indices)]
        path = path or Path(self.record["root"], self.name, f"cluster-{'-'.join(map(str, indices))}.yaml")
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    def leftovers(self, run: str) -> list[str]:
        """Containers of run ``run`` (nodes and claims) still on any host's engine."""
        left = []
        for h in self.hosts:
            for label in (f"io.rlbox.run={run}", f"io.rlbox.claim={run}"):
                out = self.docker(h["index"], "ps", "-aq", "--filter", f"label={label}", check=False).stdout.split()
                left += [f"host {h['index']}: {c}" for c in out]
        return left

    def leftovers_prefix(self, prefix: str, index: int) -> list[str]:
        """rlbox containers (nodes and claims) of runs named ``prefix``... on host ``index``."""
        out = self.docker(index, "ps", "-a", "--filter", "label=io.rlbox.managed=true",
                          "--format", '{{.Names}} {{.Label "io.rlbox.run"}}{{.Label "io.rlbox.claim"}}', check=False).stdout
        return [f"host {index}: {line.split()[0]}" for line in out.splitlines()
                if len(line.split()) > 1 and line.split()[1].startswith(prefix)]

    def remove_runs(self, prefix: str) -> None:
        """Remove every rlbox container of runs named ``prefix``... on every host."""
        for h in self.hosts:
            out = self.docker(h["index"], "ps", "-a", "--filter", "label=io.rlbox.managed=true",
                              "--format", '{{.ID}} {{.Label "io.rlbox.run"}}{{.Label "io.rlbox.claim"}}', check=False).stdout
            ids = [line.split()[0] for line in out.splitlines() if len(line.split()) > 1 and line.split()[1].startswith(prefix)]
            if ids:
                self.docker(h["index"], "rm", "-f", *ids, check=False)

    @contextlib.contextmanager
    def runs_left_none(self, prefix: str):
        """For a module's runs named ``prefix``...: afterwards none of their containers is on any host
        (each removed; any there was a leftover, and fails unless the module failed already)."""
        try:
            yield self
        finally:
            left = [line for h in self.hosts for line in self.leftovers_prefix(prefix, h["index"])]
            self.remove_runs(prefix)
        assert left == [], left

    # -- faults -------------------------------------------------------------------------------------
    def _state(self, index: int):
        from rlbox.testbed.state import load

        state = load(self.root, self.name)
        return state, state.host(index)

    @contextlib.contextmanager
    def _stopped(self, index: int, what: str):
        from rlbox.testbed import execute

        _, h = self._state(index)
        getattr(execute, f"stop_{what}")(h)
        try:
            yield
        finally:
            getattr(execute, f"start_{what}")(h, h.init_pid)

    def engine_stopped(self, index: int):
        """Host ``index``'s dockerd stopped (its containers removed first), started again after."""
        return self._stopped(index, "engine")

    def sshd_stopped(self, index: int):
        """Host ``index``'s sshd stopped, started again after."""
        return self._stopped(index, "sshd")

    @contextlib.contextmanager
    def no_route_to(self, index: int, to: int):
        """Host ``index`` cannot route to host ``to`` (a prohibit route in its namespace)."""
        netns = self.host(index)["netns"]
        target = self.address(to)
        subprocess.run(["ip", "-n", netns, "route", "add", "prohibit", f"{target}/32"], check=True)
        try:
            yield
        finally:
            subprocess.run(["ip", "-n", netns, "route", "del", "prohibit", f"{target}/32"], check=False)

    @contextlib.contextmanager
    def image_differs(self, index: int, image: str):
        """Host ``index`` holds another image under the tag ``image`` (one more layer)."""
        original = self.docker(index, "image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
        box = self.docker(index, "create", "--label", "io.rlbox.test=skew", image, "true").stdout.strip()
        try:
            self.docker(index, "commit", "--change", "LABEL io.rlbox.test=skew", box, image)
        finally:
            self.docker(index, "rm", "-f", box, check=False)
        try:
            yield self.docker(index, "image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
        finally:
            skewed = self.docker(index, "image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
            self.docker(index, "tag", original, image)
            self.docker(index, "rmi", skewed, check=False)
