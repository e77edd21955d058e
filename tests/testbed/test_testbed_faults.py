"""The testbed's own faults (issue 37), on a real 1-host testbed of this module's own: `down` with a
tampered record kills and deletes nothing that is not the testbed's (a decoy process and a decoy
link the record names survive); `down` after `up` was killed -9 finds the hosts' processes the
record does not name; `up` under a root sshd would refuse says so, and never calls a host up that
root cannot log in to.

Its testbed is named after the session's (``RLBOX_TEST_TESTBED``, 4 letters + ``q``) on a subnet
derived from the session's (third octet + 128), so that it never meets the session's testbed."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import testbed as support
from support.testbed import rlbox

SESSION_NAME = os.environ.get("RLBOX_TEST_TESTBED", "tbt")
SESSION_SUBNET = ipaddress.ip_network(os.environ.get("RLBOX_TEST_TESTBED_SUBNET", "10.201.1.0/24"))
NAME = SESSION_NAME[:4] + "q"
_OCTETS = str(SESSION_SUBNET.network_address).split(".")
SUBNET = f"{_OCTETS[0]}.{_OCTETS[1]}.{(int(_OCTETS[2]) + 128) % 256}.0/24"
ROOT = support.ROOT
# its testbed is its own, but its three tests share it: one worker, one after another, in the testbed group
# (support.testbed.require fails an ungrouped one under xdist)
pytestmark = pytest.mark.testbed
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean():
    """Nothing of this module's testbed before and after (taken down by looking)."""
    support.require()
    from rlbox.testbed import execute

    execute.teardown(None, lambda line: None, root=ROOT, name=NAME)
    yield
    left = execute.teardown(None, lambda line: None, root=ROOT, name=NAME)
    assert not left, left


def host_processes(root: str, name: str) -> list[str]:
    """Processes whose argv ends with a host folder of the testbed (the hosts' holders and inits), read
    from /proc (ps cuts long argv)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")[:-1] if proc.name.isdigit() else []
        except OSError:
            continue
        if len(argv) >= 2 and argv[-2] == b"rlbox-testbed-host" and argv[-1].startswith(f"{root}/{name}/h".encode()):
            out.append(f"{proc.name}: {argv[0].decode()} ... {argv[-1].decode()}")
    return out


def links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


def test_down_with_a_tampered_record_touches_nothing_that_is_not_the_testbeds(clean):
    from rlbox.testbed import execute

    rlbox("testbed", "up", "--hosts", 1, "--hardware", "a2", "--name", NAME, "--subnet", SUBNET, "--root", ROOT,
          check=True, timeout=300)
    decoys = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    decoy_link = f"{NAME}dcy"
    subprocess.run(["ip", "link", "add", decoy_link, "type", "bridge"], check=True)
    try:
        path = Path(ROOT, NAME, "testbed.json")
        data = json.loads(path.read_text())
        data["bridge"] = decoy_link
        data["hosts"][0] |= {"veth": decoy_link, "holder_pid": decoys[0].pid, "init_pid": decoys[1].pid}
        path.write_text(json.dumps(data))
        down = rlbox("testbed", "down", "--name", NAME, "--root", ROOT, timeout=300)
        last = down.stderr.strip().splitlines()[-1]
        assert down.returncode != 0 and "Traceback" not in down.stderr, down.stderr
        assert last.startswith(f"rlbox: error: {path}: bridge: '{decoy_link}', not 'rlbox-{NAME}'"), down.stderr
        assert all(d.poll() is None for d in decoys), "a decoy the record named was killed"
        # today's code took the decoy init_pid for a host's init and so every process of this machine for
        # the host's: it stopped this machine's own dockerd
        assert subprocess.run(["docker", "info"], capture_output=True).returncode == 0, "this machine's engine was stopped"
        assert f": {decoy_link}:" in links(), "the decoy link the record named was deleted"
        assert execute.leftovers(root=ROOT, name=NAME) == [] and host_processes(ROOT, NAME) == []
    finally:
        for d in decoys:
            d.kill()
            d.wait()
        subprocess.run(["ip", "link", "delete", decoy_link], capture_output=True)


def test_down_after_up_was_killed_finds_the_hosts_the_record_does_not_name(clean, tmp_path):
    said = tmp_path / "up.err"
    with open(said, "wb") as err:
        up = subprocess.Popen([sys.executable, "-m", "rlbox.cli", "testbed", "up", "--hosts", "1", "--hardware", "a2",
                               "--name", NAME, "--subnet", SUBNET, "--root", ROOT], cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=err)
    ready = Path(ROOT, NAME, "h1", "ready")  # the host's namespaces made, its init running
    deadline = time.monotonic() + 120
    while not ready.exists() and up.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    ended = up.poll()
    up.send_signal(signal.SIGKILL)
    up.wait()
    assert ready.exists(), (f"up ended (exit {ended}) before the host's namespaces were made: {said.read_text()!r}"
                            if ended is not None else "the host's namespaces were not made in 120 s")
    path = Path(ROOT, NAME, "testbed.json")
    data = json.loads(path.read_text())
    data["hosts"][0] |= {"holder_pid": None, "init_pid": None}  # as a record killed a moment earlier holds
    path.write_text(json.dumps(data))
    assert host_processes(ROOT, NAME), "the killed up's host processes should be running"
    down = rlbox("testbed", "down", "--name", NAME, "--root", ROOT, timeout=300)
    assert down.returncode == 0, down.stderr
    assert "mount or folder of it left (looked)" in down.stderr
    assert host_processes(ROOT, NAME) == [], "down said nothing was left while the hosts' processes run"
    assert f"rlbox-{NAME}" not in links()


def test_up_never_calls_up_a_host_root_cannot_log_in_to(clean, tmp_path, monkeypatch):
    """Under /tmp (mode 1777) each host's sshd refuses the testbed's key (StrictModes). `up` refuses
    such a root before making anything; and were it not refused, the login `up` proves fails."""
    from rlbox.core.errors import RlboxError
    from rlbox.testbed import execute
    from rlbox.testbed import plan as tbplan

    root = str(tmp_path / "beds")
    proc = rlbox("testbed", "up", "--hosts", 1, "--hardware", "a2", "--name", NAME, "--subnet", SUBNET, "--root", root,
                 timeout=120)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [
        f"rlbox: error: --root {root}: each host's sshd would refuse the testbed's key there (/tmp (mode 1777) is "
        "writable by its group and everyone; sshd's StrictModes wants every folder above the key owned by root and "
        f"writable by no one else, sticky bit or not); give another --root, e.g. the default {tbplan.DEFAULT_ROOT}"]
    assert not Path(root).exists() and f"rlbox-{NAME}" not in links()

    monkeypatch.setattr(execute, "strict_modes", lambda plan: None)
    plan = tbplan.plan_testbed(hosts=1, hardware="a2", name=NAME, subnet=SUBNET, root=root)
    with pytest.raises(RlboxError) as err:
        execute.up(plan, lambda line: None)
    assert str(err.value).startswith(f"{plan.hosts[0].address}: root cannot log in with the testbed's key ("), err.value
    assert "bad ownership or modes for directory /tmp" in str(err.value)
    assert execute.leftovers(root=root, name=NAME) == [] and host_processes(root, NAME) == []
