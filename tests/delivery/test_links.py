"""delivery.links without a host: who gets an agent, where the masters' sockets go, what is left after."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from rlbox.cluster.spec import Host
from rlbox.delivery import links

REMOTE = (Host("node-a", transport="ssh"), Host("node-b", transport="ssh"))


def test_only_a_possible_chain_starts_an_agent_and_via_launcher_forwards_none(monkeypatch):
    monkeypatch.setenv("SSH_AUTH_SOCK", "/run/user-agent.sock")  # the user's own agent: agent_for takes it
    with links.links_for(REMOTE) as chain:
        assert chain.agent is not None and chain.env["SSH_AUTH_SOCK"] == "/run/user-agent.sock"
        assert "ForwardAgent=yes" in chain.options()
    with links.links_for(REMOTE, agent=False) as launcher:
        options = launcher.options()
        assert launcher.agent is None and "ForwardAgent=yes" not in options
        assert "ControlMaster=auto" in options and f"ControlPath={launcher.masters}/%C" in options
    with links.links_for(REMOTE) as chain:  # pulls, the verify: through a master, never making one, no agent
        other = chain.options(chain=False)
        assert "ControlMaster=no" in other and "ForwardAgent=no" in other and "ForwardAgent=yes" not in other
        assert f"ControlPath={chain.masters}/%C" in other
    with links.links_for(REMOTE[:1]) as one:  # one node over ssh: nothing to forward to
        assert one.agent is None and one.masters is not None
    with links.links_for((REMOTE[0], REMOTE[0])) as twice:  # a host named twice is still one node
        assert twice.agent is None


def test_only_this_machine_needs_no_masters():
    with links.links_for((Host("localhost"),)) as local:
        assert local.masters is None and local.options() == () and local.agent is None


def test_the_masters_directory_is_private_short_and_gone_after(monkeypatch, tmp_path):
    deep = tmp_path / ("d" * 40)  # with pytest's tmp_path, a directory under it is over 49 characters
    deep.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep))  # too long for a socket path: /tmp instead
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    with links.links_for(REMOTE, agent=False) as linked:
        path = Path(linked.masters)
        # the directory, "/", %C (40) and ssh's temporary ".XXXXXXXXXXXXXXXX" while it binds: within 107
        assert len(str(path)) + 1 + 40 + 17 <= 107 and path.parent == Path("/tmp")
        assert path.stat().st_mode & 0o777 == 0o700 and path.stat().st_uid == os.getuid()
    assert not path.exists() and linked.masters is None
    assert list(deep.iterdir()) == []  # the long one tried first was removed


def test_closing_ends_the_agent_even_when_the_masters_directory_is_gone(tmp_path):
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    hosts = tuple(Host(n, transport="ssh", identity_file=str(key)) for n in ("node-a", "node-b"))
    with links.links_for(hosts) as linked:
        agent = linked.agent
        assert agent is not None and agent.pid and agent.env["SSH_AUTH_SOCK"].startswith(agent.workdir.name)
        Path(linked.masters).rmdir()  # a tmp cleaner took it: close cannot list it
    assert linked.agent is None and not Path(agent.workdir.name).exists()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{agent.pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{agent.pid}").exists()
