"""The testbed's plan (pure): names, addresses, folders, every argv, the cluster file it writes
(read back by the production parser), and one line for each bad option."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlbox.cluster import spec
from rlbox.core.errors import RlboxError
from rlbox.testbed import plan as tbplan
from rlbox.testbed.state import TestbedState, load


def test_four_a3_hosts_have_their_own_namespace_address_folder_and_devices():
    plan = tbplan.plan_testbed(hosts=4, hardware="a3", name="tb9", root="/tmp/x")
    assert [h.address for h in plan.hosts] == ["10.201.0.1", "10.201.0.2", "10.201.0.3", "10.201.0.4"]
    assert [h.netns for h in plan.hosts] == [f"rlbox-tb9-h{i}" for i in range(1, 5)]
    assert all(len(h.veth) <= 15 for h in plan.hosts) and plan.bridge == "rlbox-tb9" and plan.gateway == "10.201.0.254"
    assert [h.devices for h in plan.hosts] == [16] * 4 and {h.driver for h in plan.hosts} == {tbplan.DEFAULT_DRIVER}
    assert plan.hosts[1].dir == "/tmp/x/tb9/h2" and plan.hosts[1].socket == "/tmp/x/tb9/h2/docker.sock"


def test_the_namespaces_are_entered_with_nsenter_never_ip_netns_exec():
    h = tbplan.plan_testbed(hosts=1, hardware="a2", name="tb9").hosts[0]
    init = h.init_argv()
    assert init[:2] == ["nsenter", "--net=/var/run/netns/rlbox-tb9-h1"]
    assert {"--mount", "--pid", "--fork", "--mount-proc"} <= set(init) and "exec" not in init[:6]
    dockerd = h.dockerd_argv(4242)
    assert dockerd[:6] == ["nsenter", "--target=4242", "--mount", "--net", "--pid", "--"]
    assert {"--iptables=false", "--bridge=none"} <= set(dockerd)
    assert "unix:///run/docker.sock" in dockerd and f"unix://{h.socket}" in dockerd  # never the machine's socket path
    assert "/var/run/docker.sock" not in " ".join(dockerd)
    config = h.sshd_config("/k")
    assert "ListenAddress 10.201.0.1" in config and "SetEnv DOCKER_HOST=unix:///run/docker.sock" in config


def test_a_host_can_be_given_fewer_devices_or_an_older_driver():
    plan = tbplan.plan_testbed(hosts=3, hardware="a3", name="tb9", host_devices=("2=8",), host_driver=("3=23.0.RC1",))
    assert [(h.devices, h.driver) for h in plan.hosts] == [(16, "25.3.rc1"), (8, "25.3.rc1"), (16, "23.0.rc1")]


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "TB"}, "--name 'TB': a testbed name is a lower-case letter"),
    ({"name": "toolong"}, "--name 'toolong'"),
    ({"hosts": 0}, "--hosts 0: a testbed has 1..16 hosts"),
    ({"hardware": "h100"}, "--hardware h100: choose a2, a3 or ax"),
    ({"subnet": "8.8.8.0/24"}, "--subnet '8.8.8.0/24': give a private IPv4 /24 or larger"),
    ({"subnet": "10.1.0.0/28"}, "--subnet '10.1.0.0/28': give a private IPv4 /24 or larger"),
    ({"subnet": "10.1.0.1/24"}, "--subnet '10.1.0.1/24': 10.1.0.1/24 has host bits set"),
    ({"subnet": "127.0.0.0/24"}, "--subnet '127.0.0.0/24': give a private IPv4 /24 or larger, inside 10.0.0.0/8"),
    ({"host_devices": ("5=8",)}, "--host-devices '5=8': host 5 is not one of 1..2"),
    ({"host_devices": ("1=x",)}, "--host-devices '1=x': a device count is 0..32"),
    ({"host_driver": ("2",)}, "--host-driver '2': give HOST=VALUE"),
    ({"host_driver": ("2=1.2;rm",)}, "--host-driver '2=1.2;rm': a driver version looks like 25.3.rc1"),
    ({"root": "relative"}, "--root 'relative': an absolute path"),
])
def test_bad_options_are_one_line(kwargs, message):
    args = {"hosts": 2, "hardware": "a3", "name": "tb9"} | kwargs
    with pytest.raises(RlboxError) as err:
        tbplan.plan_testbed(**args)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_cluster_file_is_what_rlbox_run_reads_as_it_is(tmp_path):
    plan = tbplan.plan_testbed(hosts=2, hardware="a3", name="tb9", root=str(tmp_path), image="localhost/rlbox/sim:amd64",
                               nofile=20000)
    path = tmp_path / "cluster.yaml"
    path.write_text(plan.cluster_yaml())
    Path(plan.identity_file).parent.mkdir(parents=True, exist_ok=True)
    Path(plan.identity_file).touch()  # `up` generates it; the cluster file's reader wants a regular file
    cluster = spec.from_file(path)
    assert [h.name for h in cluster.hosts] == ["10.201.0.1", "10.201.0.2"]
    assert all(not h.local and h.ssh_user == "root" and h.identity_file == plan.identity_file
               and h.known_hosts == plan.known_hosts for h in cluster.hosts)
    assert cluster.hardware == "a3" and cluster.image == "localhost/rlbox/sim:amd64" and cluster.nofile == 20000


def test_dry_run_prints_every_step_and_process():
    text = tbplan.plan_testbed(hosts=2, hardware="a2", name="tb9").describe()
    for needle in ("ip link add rlbox-tb9 type bridge", "ip netns add rlbox-tb9-h2", "iptables -I FORWARD -i rlbox-tb9",
                   "setsid -f dockerd", "/usr/sbin/sshd -f", "# cluster file:", "8 NPUs"):
        assert needle in text


def test_the_state_file_is_read_back_strictly(tmp_path):
    (tmp_path / "tb9").mkdir()
    (tmp_path / "tb9" / "testbed.json").write_text('{"name": "tb9", "surprise": 1}')
    with pytest.raises(RlboxError, match=r"testbed.json: .*") as err:
        load(str(tmp_path), "tb9")
    assert "\n" not in str(err.value)
    with pytest.raises(RlboxError, match="no testbed 'tb8' under"):
        load(str(tmp_path), "tb8")
    assert TestbedState.model_fields["hosts"].is_required()
    assert not Path(tmp_path, "tb8").exists()


def test_no_production_module_imports_the_testbed():
    package = Path(tbplan.__file__).resolve().parents[1]
    users = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                   if "rlbox.testbed" in p.read_text() and p.parent.name != "testbed")
    assert users == ["cli/cmd_testbed.py"]


def test_root_and_iproute2_are_checked_first_in_one_line(monkeypatch):
    from rlbox.testbed import execute

    monkeypatch.setattr(execute.os, "geteuid", lambda: 1000)
    with pytest.raises(RlboxError, match=r"^rlbox testbed needs root .* use `rlbox run --sim` where that is not possible$"):
        execute.requirements()
    monkeypatch.setattr(execute.os, "geteuid", lambda: 0)
    monkeypatch.setattr(execute.shutil, "which", lambda tool: None if tool == "ip" else f"/usr/bin/{tool}")
    with pytest.raises(RlboxError, match=r"^rlbox testbed needs iproute2 \(`ip`\): apt-get install -y iproute2$"):
        execute.requirements()


def test_a_hosts_daemon_is_waited_for_while_it_runs_and_one_that_exited_is_said_with_its_log(tmp_path):
    """wait_for: no fixed clock for a daemon that runs (a loaded machine starts a dockerd in minutes);
    one with no process left in the host is said once gone_for has passed, with its log's last line."""
    import os
    import time

    from rlbox.testbed import execute

    host = tbplan.plan_testbed(hosts=1, hardware="a2", name="tbw", root=str(tmp_path)).hosts[0]
    Path(host.dir).mkdir(parents=True)
    Path(host.dir, "dockerd.log").write_text("starting\nfailed to start daemon: no space left on device\n")
    calls = iter([False, False, True])
    execute.wait_for(host, os.getpid(), lambda: next(calls), ("dockerd",), "dockerd", "dockerd.log", gone_for=5)
    start = time.monotonic()
    with pytest.raises(RlboxError) as err:  # os.getpid() is no host's init: no dockerd runs "in" it
        execute.wait_for(host, os.getpid(), lambda: False, ("dockerd",), "dockerd", "dockerd.log", gone_for=0.3)
    assert time.monotonic() - start < 5
    assert str(err.value) == (f"{host.address}: dockerd exited before it answered (failed to start daemon: no space "
                              f"left on device; see {host.dir}/dockerd.log)")


@pytest.mark.parametrize("env,refused", [
    ({}, False),  # a plain run: one test at a time
    ({"PYTEST_XDIST_WORKER": "gw1", "PYTEST_CURRENT_TEST": "tests/testbed/test_x.py::test_a@testbed (call)"}, False),
    ({"PYTEST_XDIST_WORKER": "gw1", "PYTEST_CURRENT_TEST": "tests/testbed/test_x.py::test_a[p@q] (setup)"}, True),
    ({"PYTEST_XDIST_WORKER": "gw0", "PYTEST_CURRENT_TEST": "tests/testbed/test_x.py::test_a (setup)"}, True),
])
def test_a_test_that_makes_a_testbed_in_no_xdist_group_is_refused(env, refused):
    """The stop-46 CI: two ungrouped tests of one module ran on two workers at once and took each other's
    testbed down. support.testbed.require refuses such a test before it makes anything."""
    from support.testbed import ungrouped_under_xdist

    why = ungrouped_under_xdist(env)
    assert (why is not None) == refused
    if refused:
        assert why.startswith("tests/testbed/test_x.py::test_a") and "in no xdist group" in why
