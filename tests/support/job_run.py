"""`rlbox run` of the steps job (tests/fixtures/launcher/steps_job.py) in a subprocess, its output
read as it arrives: shared by the node-loss tests on the simulation (tests/cluster/test_node_loss.py)
and on the testbed (tests/testbed/)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import docker
import pytest

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "fixtures" / "launcher" / "steps_job.py"
SIM = ("--sim", "--nodes", "2", "--no-doctor")
# The NPUs of the engine tests that run beside the simulated-node group (`beside_sims`, tests/conftest.py):
# ids 5-12 put their Ray ports at slot 5 (25000-25999, the published dashboard 25001), which no test of that
# group uses, and their hosts have names of their own (`own_hosts`), so no claim of one is the other's.
BESIDE_DEVICES = ("--devices", "5-12")


def own_hosts(folder: Path, *hosts: str) -> tuple[str, ...]:
    """Cluster options for simulated hosts named ``hosts`` (a cluster file under ``folder``), not the
    sim0, sim1, ... of `--sim --nodes N`: NPU claims are per host, so runs on hosts of their own never
    wait for, or are refused by, another group's runs on the same engine."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{'-'.join(hosts)}.yaml"
    path.write_text("hosts:\n" + "".join(f"  - host: {h}\n" for h in hosts))
    return ("--sim", "--cluster", str(path))


class Run:
    """`rlbox run` in a subprocess, its stderr lines timestamped as they arrive. Without the
    per-node doctor (`--no-doctor`) on the simulation: on a shared engine another run's simulated NPUs
    would fail its "devices free" check; the checks themselves are tests/cluster/test_doctor*.py's.
    ``where``: the cluster options (default two simulated nodes); on a testbed, ``--cluster FILE``
    and ``engines``, each node's engine socket (tests/testbed/)."""

    live: list["Run"] = []  # every Run started, until end_all() (tests/conftest.py, after each test)

    def __init__(self, runs: Path, shared: Path, name: str, steps: int, *extra: str, pause: float = 1.0,
                 where: tuple[str, ...] = SIM, engines: tuple[str, ...] | None = None, verl: bool = False):
        shared.mkdir(parents=True, exist_ok=True)
        shutil.copy(JOB, shared / "steps_job.py")
        self.name, self.runs, self.shared = name, runs, shared
        self.engines = engines  # per node, the unix socket of its host's engine (None: this machine's)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlbox.cli", "run", *where, "--name", name, "--runs-dir", str(runs),
             "--mount", f"{shared}:/shared", *extra, "--",
             "python3", "/shared/steps_job.py", str(steps), str(pause), "/shared/ckpt.json", *(["verl"] if verl else [])],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        Run.live.append(self)
        self.lines: list[tuple[float, str]] = []
        self.out: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stderr, self.lines, True), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stdout, self.out, False), daemon=True).start()

    @classmethod
    def end_all(cls) -> None:
        """Kill every `rlbox run` a test started and left running (an assertion failed mid-run): one left
        would go on restarting its cluster beside the next tests, holding their ports and NPUs. What it
        made is removed by the tests' own cleanup (support.engine.remove_test_runs)."""
        while cls.live:
            run = cls.live.pop()
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait(timeout=30)

    @staticmethod
    def _read(stream, into, stamped):
        for line in stream:
            into.append((time.monotonic(), line) if stamped else line)

    def wait_for(self, text: str, timeout: float = 600) -> None:
        """Until ``text`` is in the run's output (the run ending first, or ``timeout``, fails the test).
        600 s by default: a run whose head's Ray start timed out comes up again, twice at most
        (watch.START_AGAIN), each bring-up bounded by the run's own timeout; under a loaded CI three
        bring-ups took over 180 s before the first step (ci11: test_head_lost, the product right)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in (x[1] if isinstance(x, tuple) else x) for x in self.lines + self.out):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.proc.kill()
        pytest.fail(f"never saw {text!r}:\n{self.stderr()[-3000:]}")

    def container(self, index: int) -> str:
        state = json.loads((self.runs / self.name / "state.json").read_text())
        return state["nodes"][index]["container"]

    def kill(self, index: int) -> float:
        client = docker.DockerClient(base_url=f"unix://{self.engines[index]}") if self.engines else docker.from_env()
        client.containers.get(self.container(index)).kill()
        return time.monotonic()

    def finish(self, timeout: float = 240) -> int:
        code = self.proc.wait(timeout=timeout)
        time.sleep(0.2)  # the reader threads drain the pipes
        return code

    def stderr(self) -> str:
        return "".join(x[1] for x in self.lines)

    def stdout(self) -> str:
        return "".join(self.out)

    def seen_at(self, text: str) -> float:
        return next(t for t, line in self.lines if text in line)

    def state(self) -> dict:
        return json.loads((self.runs / self.name / "state.json").read_text())
