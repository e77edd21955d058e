"""Nothing the testbed reads back is trusted (issue 37): its record is held against what `up`
would have written (one line naming the file and the field otherwise), a process is the
testbed's only when it proves it (argv, namespaces, cgroup), and a root sshd's StrictModes would
refuse is refused before anything is made. Pure: facts in, judgements out (milliseconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlbox.core.errors import RlboxError
from rlbox.testbed import execute
from rlbox.testbed import plan as tbplan
from rlbox.testbed import state as tbstate
from rlbox.testbed import trust

REPO = Path(__file__).resolve().parents[2]
ROOT = "/var/lib/rlbox-testbed"


def record(root: str = ROOT, name: str = "tb9", hosts: int = 2) -> dict:
    """What `up` writes for NAME under ROOT (its own code path, `_state`)."""
    plan = tbplan.plan_testbed(hosts=hosts, hardware="a3", name=name, root=root, subnet="10.213.9.0/24")
    return json.loads(execute.state_of(plan, "up", {1: (4100, 4101), 2: (4200, 4201)}).model_dump_json())


def tampered(path: str, value) -> dict:
    data = record()
    *parents, last = path.split(".")
    target = data
    for p in parents:
        target = target[int(p)] if p.isdigit() else target[p]
    target[int(last) if last.isdigit() else last] = value
    return data


def test_what_up_writes_is_read_back():
    state = tbstate.parse(json.dumps(record()), "/x/testbed.json", ROOT, "tb9")
    assert state.hosts[1].netns == "rlbox-tb9-h2" and state.hosts[1].init_pid == 4201
    assert tbstate.parse(json.dumps(record()), "/x/testbed.json", ROOT + "/", "tb9").root == ROOT


@pytest.mark.parametrize("field, value, expected", [
    ("bridge", "eth0", "bridge: 'eth0', not 'rlbox-tb9'"),
    ("bridge", "docker0", "bridge: 'docker0', not 'rlbox-tb9'"),
    ("hosts.0.netns", "-all", "hosts.0.netns: '-all', not 'rlbox-tb9-h1'"),
    ("hosts.1.veth", "docker0", "hosts.1.veth: 'docker0', not 'rlbox-tb9-h2'"),
    ("hosts.0.holder_pid", 1, "hosts.0.holder_pid: Input should be greater than or equal to 2"),
    ("hosts.0.init_pid", -5, "hosts.0.init_pid: Input should be greater than or equal to 2"),
    ("hosts.0.init_pid", 4100, "hosts.0.init_pid: the same pid as holder_pid"),
    ("hosts.0.dir", "/", "hosts.0.dir: '/', not '/var/lib/rlbox-testbed/tb9/h1'"),
    ("name", "tb8", "name: 'tb8', not this testbed's name 'tb9'"),
    ("root", "/", "root: '/', not this testbed's root '/var/lib/rlbox-testbed'"),
    ("subnet", "junk", "subnet: subnet 'junk': 'junk' does not appear to be an IPv4 or IPv6 network"),
    ("subnet", "8.8.8.0/24", "subnet: subnet '8.8.8.0/24': give a private IPv4 /24 or larger"),
    ("hosts.0.address", "10.213.9.1;reboot", "hosts.0.address: String should have at most 15 characters"),
    ("hosts.0.address", "10.213.9.7", "hosts.0.address: '10.213.9.7', not '10.213.9.1'"),
    ("hosts.1.index", 1, "hosts: host indices are not 1..N in order"),
    ("identity_file", "/root/.ssh/id_ed25519", "identity_file: '/root/.ssh/id_ed25519', not "),
    ("phase", "gone", "phase: Input should be 'starting' or 'up'"),
    ("hardware", "h100", "hardware: Input should be 'a2', 'a3' or 'ax'"),
    ("image", "x; rm -rf /", "image: String should match pattern"),
    ("hosts.0.driver", "1.2;x", "hosts.0.driver: 1.2;x: a driver version looks like 25.3.rc1"),
    ("hosts", [], "hosts: Tuple should have at least 1 item"),
])
def test_a_record_up_would_not_write_is_one_line_naming_the_file_and_field(field, value, expected):
    with pytest.raises(RlboxError) as err:
        tbstate.parse(json.dumps(tampered(field, value)), "/r/tb9/testbed.json", ROOT, "tb9")
    line = str(err.value)
    assert line.startswith(f"/r/tb9/testbed.json: {expected}"), line
    assert "\n" not in line and "rlbox testbed down --name tb9 --root /var/lib/rlbox-testbed" in line


@pytest.mark.parametrize("text, expected", [
    ("[" * 100000 + "]" * 100000, "not a testbed record (not JSON: nested too deeply)"),
    ('{"hosts": ' + "[" * 100000 + "]" * 100000 + "}", "not a testbed record (not JSON: nested too deeply)"),
    ("[1, 2]", "not a testbed record (a JSON list, not an object)"),
    ("{", "not a testbed record (not JSON: Expecting property name"),
    ('{"name": "tb9", "surprise": 1}', "root: Field required"),
])
def test_a_record_that_is_no_record_is_one_line(text, expected):
    with pytest.raises(RlboxError) as err:
        tbstate.parse(text, "/r/tb9/testbed.json", ROOT, "tb9")
    assert str(err.value).startswith(f"/r/tb9/testbed.json: {expected}") and "\n" not in str(err.value)


def test_status_with_a_tampered_record_is_one_line_and_no_traceback(tmp_path):
    root = str(tmp_path / "r")
    Path(root, "tb9").mkdir(parents=True)
    data = record(root=root)
    data["hosts"][0]["address"] = "10.213.9.1;x"
    Path(root, "tb9", "testbed.json").write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, "-m", "rlbox.cli", "testbed", "status", "--name", "tb9", "--root", root],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"rlbox: error: {root}/tb9/testbed.json: hosts.0.address: '10.213.9.1;x', not '10.213.9.1'; not what "
        f"`rlbox testbed up` writes; `rlbox testbed down --name tb9 --root {root}` removes only what it finds is "
        "testbed tb9's"]


# -- whose a process is ------------------------------------------------------------------------------
MACHINE = trust.Machine(nets=frozenset({"net:[1]"}), pidnss=frozenset({"pid:[1]"}), protected=frozenset({1, 50}))
HOSTS = [trust.HostFacts(1, f"{ROOT}/tb9/h1", "rlbox-tb9-h1", "net:[91]"),
         trust.HostFacts(2, f"{ROOT}/tb9/h2", "rlbox-tb9-h2", "")]
INIT = ("sh", "-c", tbplan.HOST_INIT, "rlbox-testbed-host")


@pytest.mark.parametrize("proc, host", [
    (trust.Proc(100, ("unshare", "--fork", "--", *INIT, f"{ROOT}/tb9/h1"), "net:[91]", "pid:[1]"), 1),  # holder
    (trust.Proc(101, (*INIT, f"{ROOT}/tb9/h1"), "net:[91]", "pid:[71]"), 1),  # init
    (trust.Proc(102, ("dockerd",), "net:[91]", "pid:[71]"), 1),  # in its namespaces
    (trust.Proc(103, ("sleep", "9"), "net:[91]", "pid:[1]"), 1),  # in its network namespace
    (trust.Proc(104, ("python3",), "net:[5]", "pid:[5]", ("/rlbox-tb9-h1/abc",)), 1),  # a container of its engine
    (trust.Proc(201, (*INIT, f"{ROOT}/tb9/h2"), "net:[92]", "pid:[72]"), 2),  # host 2, its netns already deleted
    (trust.Proc(202, ("sshd",), "net:[92]", "pid:[72]"), 2),
    (trust.Proc(300, ("sleep", "600"), "net:[1]", "pid:[1]"), None),  # a decoy a record may name
    (trust.Proc(301, (*INIT, f"{ROOT}/tb8/h1"), "net:[93]", "pid:[73]"), None),  # another testbed's host
    (trust.Proc(302, ("sh", "-c", "x", "rlbox-testbed-host", f"{ROOT}/tb9/h1/.."), "net:[1]", "pid:[1]"), None),
    (trust.Proc(1, (*INIT, f"{ROOT}/tb9/h1"), "net:[91]", "pid:[71]"), None),  # PID 1 never
    (trust.Proc(50, ("rlbox", "testbed", "down"), "net:[91]", "pid:[1]"), None),  # rlbox itself never
    (trust.Proc(303, ("bash",), "net:[1]", "pid:[1]", ("/user.slice/rlbox-tb9-h10",)), None),
])
def test_a_process_is_a_hosts_only_when_it_proves_it(proc, host):
    found = trust.host_processes([proc, *FIXED], HOSTS, MACHINE)
    owner = [i for i, procs in found.items() if proc in procs]
    assert owner == ([host] if host else [])


FIXED = [trust.Proc(101, (*INIT, f"{ROOT}/tb9/h1"), "net:[91]", "pid:[71]"),
         trust.Proc(201, (*INIT, f"{ROOT}/tb9/h2"), "net:[92]", "pid:[72]")]


def test_a_netns_that_is_the_machines_own_claims_nothing():
    """`ip netns attach rlbox-tb9-h1 1` would make the host's netns this machine's: it then proves nothing."""
    hosts = [trust.HostFacts(1, f"{ROOT}/tb9/h1", "rlbox-tb9-h1", "net:[1]")]
    assert trust.host_processes([trust.Proc(300, ("sleep", "600"), "net:[1]", "pid:[1]")], hosts, MACHINE) == {}
    init = trust.Proc(101, (*INIT, f"{ROOT}/tb9/h1"), "net:[1]", "pid:[1]")  # no PID namespace of its own
    assert trust.init_of([init], f"{ROOT}/tb9/h1", MACHINE) is None and trust.holder_of([init], f"{ROOT}/tb9/h1", MACHINE) == 101


# -- sshd's StrictModes ---------------------------------------------------------------------------
@pytest.mark.parametrize("chain, expected", [
    ([("/tmp/x", 0, 0o40755), ("/tmp", 0, 0o41777), ("/", 0, 0o40755)], "/tmp (mode 1777) is writable by its group and everyone"),
    ([("/srv/x", 0, 0o40775), ("/srv", 0, 0o40755), ("/", 0, 0o40755)], "/srv/x (mode 0775) is writable by its group"),
    ([("/home/u/x", 0, 0o40755), ("/home/u", 1000, 0o40755), ("/", 0, 0o40755)], "/home/u is owned by uid 1000, not root"),
    ([("/var/lib/t", 0, 0o40755), ("/var/lib", 0, 0o40755), ("/var", 0, 0o40755), ("/", 0, 0o40755)], None),
    ([("/root/t", 0, 0o40755), ("/root", 0, 0o40700), ("/", 0, 0o40777)], None),  # sshd stops at the home folder
])
def test_a_root_sshd_would_refuse_is_named(chain, expected):
    assert trust.strict_modes_problem(chain, 0, "/root") == expected


def test_up_refuses_a_root_under_tmp_before_making_anything(tmp_path, monkeypatch):
    plan = tbplan.plan_testbed(hosts=1, hardware="a2", name="tb9", root="/tmp/rlbox-trust-test")
    with pytest.raises(RlboxError) as err:
        execute.strict_modes(plan)
    assert str(err.value).startswith("--root /tmp/rlbox-trust-test: each host's sshd would refuse the testbed's key "
                                     "there (/tmp (mode 1777) is writable by its group and everyone;")
    assert not Path("/tmp/rlbox-trust-test").exists()


def test_the_take_it_down_advice_works_as_printed_with_another_root():
    assert execute.down_command("/srv/tb/", "tb9") == "rlbox testbed down --name tb9 --root /srv/tb"
    assert execute.down_command(ROOT, "tb9") == "rlbox testbed down --name tb9"


def test_down_deletes_a_folder_only_when_it_holds_what_up_makes(tmp_path):
    for entry in ("testbed.json", "h1", "h12", "cluster.yaml", "cluster-2-1.yaml", "id_ed25519", "rlbox-tb9-image-x1"):
        (tmp_path / entry).touch()
    assert execute.testbed_folder(str(tmp_path), "tb9")
    (tmp_path / "passwd").touch()
    assert not execute.testbed_folder(str(tmp_path), "tb9")
