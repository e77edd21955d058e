"""The connection counting a host's NPUs opened is the run's own (hosts.keep / connect): taken once, by the
same ssh settings only, never a dead one."""

import subprocess
import sys

import pytest

from rlbox.cluster import hosts
from rlbox.cluster.spec import Host
from rlbox.core.errors import RlboxError


def _node(host: Host, alive: bool = True) -> hosts.Node:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"] if alive else ["true"],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if not alive:
        proc.wait(timeout=10)
    return hosts.Node(host, client=object(), tunnels=[hosts.Tunnel(proc, "sock")])


@pytest.fixture(autouse=True)
def nothing_kept():
    hosts.close_kept()
    yield
    hosts.close_kept()


UNREACHABLE = Host("rlbox-no-such-host.invalid", ssh_user="u", ssh_port=2222)


def test_the_kept_connection_is_taken_once_with_this_host_s_record():
    node = _node(UNREACHABLE)
    hosts.keep(node)
    again = hosts.connect(Host("rlbox-no-such-host.invalid", ssh_user="u", ssh_port=2222, nic="eth1"))
    assert again.client is node.client and again.host.nic == "eth1"
    with pytest.raises(RlboxError, match="rlbox-no-such-host.invalid: cannot reach over ssh"):
        hosts.connect(UNREACHABLE)  # taken already: a new connection is tried (and fails here)
    node.close()


@pytest.mark.parametrize("other", [
    Host("rlbox-no-such-host.invalid", ssh_user="u", ssh_port=2223),  # another port is another way in
    Host("rlbox-no-such-host.invalid", ssh_user="v", ssh_port=2222),
    Host("rlbox-no-such-host.invalid", ssh_user="u", ssh_port=2222, identity_file="/k"),
])
def test_other_ssh_settings_never_take_it(other):
    node = _node(UNREACHABLE)
    hosts.keep(node)
    with pytest.raises(RlboxError, match="cannot reach over ssh"):
        hosts.connect(other)
    assert node.tunnels[0].proc.poll() is None  # still kept, still open
    hosts.close_kept()
    assert node.tunnels[0].proc.wait(timeout=10) is not None  # closed with the others


def test_a_dead_kept_connection_is_closed_not_used():
    node = _node(UNREACHABLE, alive=False)
    hosts.keep(node)
    with pytest.raises(RlboxError, match="cannot reach over ssh"):
        hosts.connect(UNREACHABLE)
    assert node.tunnels[0].proc.stderr.closed
