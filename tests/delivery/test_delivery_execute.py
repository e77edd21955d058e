"""Image delivery on real engines: three hosts, each its own dockerd and sshd (support.engines),
the image on this machine's engine, `rlbox distribute` as a user runs it. A chain through all
three, layers held not sent, a different image under the name refused then replaced, Ctrl-C
mid-transfer, and `rlbox run`'s own delivery step (deliver.ensure)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, engine_problem, rlbox
from rlbox.delivery import execute as deliver
from rlbox.delivery import links
from rlbox.cluster import spec as cluster_spec
from rlbox.core.errors import RlboxError
from support.engines import EngineHosts

pytestmark = pytest.mark.engine
TAG = f"ds-t{os.getpid()}"
REGISTRY = "127.0.0.1:22501"  # Debian's docker-registry, no auth, for the pull path


def build(ctx: Path, tag: str, layers: dict[str, int], seed: str) -> str:
    """FROM scratch plus one COPY layer per file (name -> size); files of one name and seed are
    identical, so images sharing the lower files share those layers."""
    ctx.mkdir(parents=True, exist_ok=True)
    lines = ["FROM scratch"]
    for name, size in layers.items():
        path = ctx / name
        if not path.exists():
            subprocess.run(["sh", "-c", f"openssl enc -aes-128-ctr -pass pass:{seed}{name} -nosalt -pbkdf2 "
                            f"< /dev/zero 2>/dev/null | head -c {size} > {path}"], check=True)
        lines.append(f"COPY {name} /{name}")
    (ctx / "Dockerfile").write_text("\n".join(lines) + "\n")
    subprocess.run(["docker", "build", "-q", "-t", tag, str(ctx)], check=True, capture_output=True,
                   env=dict(os.environ, DOCKER_BUILDKIT="0"))
    return subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture(scope="module")
def docker_engine():
    """The engine alone (no shared test images needed): a missing one fails, never skips."""
    problem = engine_problem()
    if problem:
        pytest.fail(f"delivery tests need a Docker engine: {problem}")


@pytest.fixture(scope="module")
def images(docker_engine, tmp_path_factory):
    ctx = tmp_path_factory.mktemp("ctx")
    made = {
        "one": build(ctx, f"{TAG}-one:1", {"a": 3 << 20, "b": 3 << 20, "c": 3 << 20}, "s"),
        "two": build(ctx, f"{TAG}-two:1", {"a": 3 << 20, "b": 3 << 20, "d": 3 << 20}, "s"),
        "big": build(ctx, f"{TAG}-big:1", {"e": 60 << 20, "f": 60 << 20, "g": 60 << 20}, "s"),
    }
    yield made
    subprocess.run(["docker", "image", "rm", "-f", *(f"{TAG}-{k}:1" for k in made), f"{TAG}-mm:1"],
                   capture_output=True)


@pytest.fixture(scope="module")
def hosts(docker_engine, tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("delivery tests start their own dockerd and sshd: run as root")
    with EngineHosts(tmp_path_factory.mktemp("hosts"), 3, prefix="ds", first_address=40,
                     insecure_registry=REGISTRY) as hs:  # not bench/distribute.py's addresses (.20-)
        yield hs


def clear_hosts(hosts) -> None:
    for h in hosts:
        ids = h.docker("image", "ls", "-aq").stdout.split()
        if ids:
            h.docker("image", "rm", "-f", *set(ids), check=False)


@pytest.fixture
def cluster(hosts, tmp_path):
    clear_hosts(hosts)  # each test starts from empty engines
    return hosts.cluster_file(tmp_path / "cluster.yaml")


def preload(host, image: str) -> None:
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    host.docker("load", "-q", stdin=save.stdout)
    assert save.wait() == 0


def leftovers() -> list[str]:
    """Processes of a delivery to these tests' hosts (all on this machine): the launcher's ssh and
    the nodes' scripts name a host address of this module (127.0.0.40-42)."""
    proc = subprocess.run(["pgrep", "-af", "rlbox-deliver-"], capture_output=True, text=True)
    return [line for line in proc.stdout.splitlines()
            if "pgrep" not in line and any(f"127.0.0.{40 + i}" in line for i in range(3))]


def assert_no_leftovers(wait: float = 30) -> None:
    """Every delivery process ends: the nodes' scripts exit once their input has ended."""
    deadline = time.monotonic() + wait
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert leftovers() == []


def test_chain_delivers_to_those_missing_and_verifies(hosts, cluster, images):
    image = f"{TAG}-one:1"
    preload(hosts[0], image)
    dry = rlbox("distribute", image, "--cluster", cluster, "--dry-run", check=True).stdout
    assert f"{hosts[0].address}" in dry and "has it: skipped" in dry
    assert f"this machine -> {hosts[1].address} -> {hosts[2].address}" in dry
    proc = rlbox("distribute", image, "--cluster", cluster, check=True)
    assert f"{hosts[1].address}: loaded" in proc.stderr and f"{hosts[2].address}: verified" in proc.stderr
    assert [h.image_id(image) for h in hosts] == [images["one"]] * 3
    assert_no_leftovers()
    again = rlbox("distribute", image, "--cluster", cluster, "--dry-run", check=True).stdout
    assert "nothing to deliver" in again


def test_layers_every_target_holds_are_not_sent(hosts, cluster, images):
    for h in hosts:
        preload(h, f"{TAG}-one:1")  # layers a, b held; c is not what two needs
    image = f"{TAG}-two:1"
    dry = rlbox("distribute", image, "--cluster", cluster, "--dry-run", check=True).stdout
    assert "2 of 3 held by every receiving node: not sent" in dry
    proc = rlbox("distribute", image, "--cluster", cluster, check=True)
    sent = next(line for line in proc.stderr.splitlines() if "sent)" in line)
    assert "(3.1 MB sent)" in sent or "(3.2 MB sent)" in sent, sent  # one 3 MiB layer, not 9
    assert [h.image_id(image) for h in hosts] == [images["two"]] * 3  # engine 20.10 loaded the thinner tar


def test_another_image_under_the_name_is_named_then_replaced_with_force(hosts, cluster, images):
    image = f"{TAG}-mm:1"
    subprocess.run(["docker", "tag", f"{TAG}-two:1", image], check=True)
    preload(hosts[1], image)  # hosts[1] holds "two" under the name
    subprocess.run(["docker", "tag", f"{TAG}-one:1", image], check=True)  # here: "one"
    proc = rlbox("distribute", image, "--cluster", cluster)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"{hosts[1].address} has {images['two'][7:19]}" in proc.stderr and "--force" in proc.stderr
    assert hosts[0].image_id(image) is None  # refused before anything moved
    rlbox("distribute", image, "--cluster", cluster, "--force", check=True)
    assert [h.image_id(image) for h in hosts] == [images["one"]] * 3


def test_ctrl_c_mid_transfer_leaves_nothing(hosts, cluster, images):
    image = f"{TAG}-big:1"
    proc = subprocess.Popen([sys.executable, "-m", "rlbox.cli", "distribute", image, "--cluster", str(cluster)],
                            cwd=REPO, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:  # the first quarter sent: mid-transfer
        seen.append(line)
        if "sent " in line:
            break
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, "".join(seen) + rest
    last = rest.strip().splitlines()[-1]
    assert last.startswith("rlbox: error: interrupted;") and hosts[2].address in last, rest
    assert [h.image_id(image) for h in hosts] == [None, None, None]
    assert_no_leftovers()
    for h in hosts:  # nothing loaded half: no image at all, no dangling one either
        assert h.docker("image", "ls", "-aq").stdout.strip() == ""


def test_a_node_failing_mid_chain_is_named_and_the_others_complete(hosts, cluster, images):
    spec = cluster_spec.from_file(cluster)
    image = f"{TAG}-one:1"
    plan, by_label = deliver.make_plan(image, spec.hosts)
    assert plan.order == tuple(h.address for h in hosts)
    hosts[1].stop_engine()  # after the plan: its load fails; it still forwards to the next
    try:
        with pytest.raises(RlboxError) as failed:
            deliver.carry_out(plan, by_label, lambda line: None)
    finally:
        hosts[1].start_engine()
    line = str(failed.value)
    assert line.startswith(f"{hosts[1].address}: load failed (") and "\n" not in line, line
    assert f"complete on {hosts[0].address}, {hosts[2].address}" in line, line
    assert f"could not check {hosts[1].address}" in line, line
    assert [h.image_id(image) for h in hosts] == [images["one"], None, images["one"]]
    assert_no_leftovers()


def test_a_node_that_cannot_be_reached_mid_chain_is_named_at_once_and_the_one_before_it_completes(hosts, cluster, images):
    """The second node's sshd stops taking connections after the gather (its master from this machine
    goes on): the first node's hop to it is refused, and ssh's line ends the launcher's hold for the
    nodes past it at once, not after ssh's connect timeout of silence; the first node loads."""
    from rlbox.cluster.hosts import SSH_CONNECT_TIMEOUT

    spec = cluster_spec.from_file(cluster)
    image = f"{TAG}-one:1"
    with links.links_for(spec.hosts) as open_links:
        plan, by_label = deliver.make_plan(image, spec.hosts, links=open_links)
        assert plan.order == tuple(h.address for h in hosts)
        hosts[1].sshd.stop_listening()
        try:
            started = time.monotonic()
            with pytest.raises(RlboxError) as failed:
                deliver.carry_out(plan, by_label, lambda line: None, links=open_links)
            took = time.monotonic() - started
        finally:
            hosts[1].sshd.listen_again()
    line = str(failed.value)
    refused = f"load failed (ssh: connect to host {hosts[1].address} port {hosts[1].sshd.port}: Connection refused)"
    assert f"{hosts[1].address}: {refused}" in line and f"{hosts[2].address}: {refused}" in line, line
    assert f"complete on {hosts[0].address}" in line and "\n" not in line, line
    assert took < SSH_CONNECT_TIMEOUT, took
    assert [h.image_id(image) for h in hosts] == [images["one"], None, None]
    assert_no_leftovers()


def test_a_hop_goes_through_the_master_its_sender_warmed_and_none_outlives_the_delivery(hosts, cluster, tmp_path):
    """The warm-up's master on a sending node carries the hop to its child: the hop, from a session
    with no agent, gets in only through it (without a master it is refused, so the first half
    cannot pass by luck); the master ends when the warm-up's input closes, its socket with it."""
    import secrets

    from rlbox.delivery import stream as dstream
    from rlbox.cluster.hosts import ssh_base, ssh_target

    spec = cluster_spec.from_file(cluster)
    sender, child = spec.hosts[1], spec.hosts[2]
    marker = f"rlbox-deliver-t{secrets.token_hex(3)}"
    agent = links.agent_for([sender, child])
    control = ssh_base(child) + ["-o", f"ControlPath={dstream.control_path(marker)}"]

    def on_sender(words: list[str]) -> subprocess.CompletedProcess:  # no -A: no agent on the sender
        return subprocess.run(dstream.on_host(sender, words), capture_output=True, text=True, timeout=60)

    def master_running() -> bool:
        return on_sender(control + ["-O", "check", "--", ssh_target(child)]).returncode == 0

    try:
        refused = on_sender(dstream.hop(child, marker) + ["echo", "through"])
        assert refused.returncode == 255 and "ermission denied" in refused.stderr, refused
        warm = subprocess.Popen(dstream.on_host(sender, dstream.warm_words(child, marker), "-A"),
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=agent.env)
        deadline = time.monotonic() + 30
        while not master_running():
            assert warm.poll() is None and time.monotonic() < deadline, warm.stderr.read() if warm.poll() else "no master"
            time.sleep(0.2)
        through = on_sender(dstream.hop(child, marker) + ["echo", "through"])
        assert through.returncode == 0 and through.stdout == "through\n", through
        # the child gets the agent through the master: it can make its own hop when its master is late
        keys = on_sender(dstream.hop(child, marker) + ["ssh-add", "-l"])
        assert keys.returncode == 0 and "no identities" not in keys.stdout, keys
        # a hop still running when the warm-up ends (the delivery's end, or its session cut) finishes
        begun = tmp_path / "begun"  # the hosts are this machine's: the hop's file is seen here
        running = subprocess.Popen(dstream.on_host(sender, dstream.hop(child, marker) + [  # one word: the child's shell runs it
            f"touch {begun}; sleep 2; echo done"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not begun.exists():
            assert running.poll() is None and time.monotonic() < deadline, running.stderr.read() if running.poll() else ""
            time.sleep(0.05)
        warm.stdin.close()
        out, err = running.communicate(timeout=60)
        assert running.returncode == 0 and out == "done\n", (out, err)
        warm.wait(timeout=30)
        assert not master_running()
        assert not list(Path.home().glob(f".{marker}-*")) and leftovers() == []
    finally:
        agent.close()


def test_the_gathers_sessions_leave_masters_every_later_session_uses_and_the_delivery_ends(hosts, cluster, images):
    """links_for: the gather's session to each node leaves a master on this machine; a later session
    with the links' options gets in through it alone (its own key is one that no host accepts, so
    without the master it is refused), and carries the agent; closing the links ends every master
    and removes their directory."""
    from dataclasses import replace

    from rlbox.delivery import stream as dstream

    spec = cluster_spec.from_file(cluster)
    image = f"{TAG}-one:1"
    stranger = [replace(h, identity_file="/nonexistent/key") for h in spec.hosts]
    with links.links_for(spec.hosts) as linked:
        masters = linked.masters
        assert masters and len(masters) + 41 <= links.SOCKET_MAX
        refused = subprocess.run(dstream.on_host(stranger[0], ["true"], *linked.options()), capture_output=True,
                                 text=True, timeout=60, env=linked.env)
        assert refused.returncode == 255, refused  # no master yet: its own connection, refused
        plan, by_label = deliver.make_plan(image, spec.hosts, links=linked)
        assert plan.needed and len(list(Path(masters).iterdir())) == len(hosts)
        for host in stranger:
            through = subprocess.run(dstream.on_host(host, ["ssh-add", "-l"], *linked.options()), capture_output=True,
                                     text=True, timeout=60, env=linked.env)
            assert through.returncode == 0 and "no identities" not in through.stdout, through
        deliver.carry_out(plan, by_label, lambda line: None, links=linked)
        assert len(list(Path(masters).iterdir())) == len(hosts)  # the delivery's sessions went through them
    assert not Path(masters).exists() and linked.agent is None
    assert subprocess.run(["pgrep", "-f", masters], capture_output=True).returncode == 1
    assert [h.image_id(image) for h in hosts] == [images["one"]] * 3
    assert_no_leftovers()


def test_run_delivers_and_refuses_a_different_image(hosts, cluster, images):
    spec = cluster_spec.from_file(cluster)
    lines = []
    image = f"{TAG}-one:1"
    report = deliver.ensure(image, spec.hosts, lines.append, missing_hint="build it")
    assert report is not None and [h.image_id(image) for h in hosts] == [images["one"]] * 3
    assert deliver.ensure(image, spec.hosts, lines.append, missing_hint="build it") is None  # nothing to do
    # what rlbox run's open connections said each node holds: this machine's image everywhere, nothing asked
    assert deliver.ensure(image, spec.hosts, lines.append, missing_hint="build it", held=(images["one"],) * 3) is None
    subprocess.run(["docker", "tag", f"{TAG}-two:1", f"{TAG}-mm:1"], check=True)
    preload(hosts[2], f"{TAG}-mm:1")
    subprocess.run(["docker", "tag", f"{TAG}-one:1", f"{TAG}-mm:1"], check=True)
    with pytest.raises(RlboxError, match=f"{hosts[2].address} has {images['two'][7:19]}"):
        deliver.ensure(f"{TAG}-mm:1", spec.hosts, lines.append, missing_hint="build it")
    # the nodes agreeing is not enough: this machine holds another image under the name, so they are asked
    # (two of them lack it: it is delivered)
    subprocess.run(["docker", "tag", f"{TAG}-two:1", f"{TAG}-mm:1"], check=True)
    assert deliver.ensure(f"{TAG}-mm:1", spec.hosts, lines.append, missing_hint="build it",
                          held=(images["one"],) * 3) is not None
    assert [h.image_id(f"{TAG}-mm:1") for h in hosts] == [images["two"]] * 3
    with pytest.raises(RlboxError, match=f"{hosts[0].address}: image {TAG}-nothing:1 is not present; build it"):
        deliver.ensure(f"{TAG}-nothing:1", spec.hosts, lines.append, missing_hint="build it")


@pytest.fixture
def registry(tmp_path):
    exe = shutil.which("docker-registry")
    if exe is None:
        pytest.fail("the pull path needs Debian's docker-registry (apt-get install docker-registry)")
    config = tmp_path / "registry.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
                      f"http:\n  addr: {REGISTRY}\n")
    proc = subprocess.Popen([exe, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if subprocess.run(["curl", "-sf", f"http://{REGISTRY}/v2/"], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        proc.wait()


def test_registry_pulls_on_every_node_then_falls_back_to_the_stream(hosts, cluster, images, registry):
    image = f"{REGISTRY}/{TAG}/one:1"
    subprocess.run(["docker", "tag", f"{TAG}-one:1", image], check=True)
    try:
        subprocess.run(["docker", "push", image], check=True, capture_output=True)
        dry = rlbox("distribute", image, "--cluster", cluster, "--dry-run", check=True).stdout
        assert f"registry {REGISTRY}: docker pull on every receiving node at once" in dry
        proc = rlbox("distribute", image, "--cluster", cluster, check=True)
        assert proc.stderr.count(": pulled\n") == 3 and "pulled on 3" in proc.stderr
        assert [h.image_id(image) for h in hosts] == [images["one"]] * 3
        clear_hosts(hosts)
        registry.terminate()  # the nodes cannot reach it any more: each falls back to the stream
        registry.wait()
        proc = rlbox("distribute", image, "--cluster", cluster, check=True)
        assert "pull failed on" in proc.stderr and "streamed to 3" in proc.stderr, proc.stderr
        assert [h.image_id(image) for h in hosts] == [images["one"]] * 3
    finally:
        subprocess.run(["docker", "image", "rm", image], capture_output=True)


def test_a_node_holding_it_is_the_source_when_this_machine_lacks_it(hosts, cluster, images, tmp_path):
    image = f"{TAG}-only:1"
    subprocess.run(["docker", "tag", f"{TAG}-one:1", image], check=True)
    preload(hosts[0], image)
    subprocess.run(["docker", "image", "rm", image], check=True, capture_output=True)  # only the tag goes
    dry = rlbox("distribute", image, "--cluster", cluster, "--dry-run", check=True).stdout
    assert f"source   {hosts[0].address} (docker save there, sent from it directly)" in dry, dry
    assert f"stream   {hosts[0].address} -> {hosts[1].address} -> {hosts[2].address}" in dry, dry
    done = rlbox("distribute", image, "--cluster", cluster, check=True).stderr
    assert "sent" not in done.split("streamed to 2")[1].split(")")[0] or "(0 B sent)" in done, done  # none through here
    assert [h.image_id(image) for h in hosts] == [images["one"]] * 3
    assert_no_leftovers()


def running(pattern: str) -> list[str]:
    """This machine's processes whose command line has ``pattern`` (the test hosts share its pids)."""
    return subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout.splitlines()


def test_ctrl_c_while_a_node_is_the_source_leaves_nothing(hosts, cluster, images):
    """The source node's own docker save feeds the others directly; Ctrl-C here ends the launcher's
    ssh to it, and then its save, its stream and every load below it."""
    image = f"{TAG}-bigsrc:1"
    subprocess.run(["docker", "tag", f"{TAG}-big:1", image], check=True)
    try:
        preload(hosts[0], image)
    finally:
        subprocess.run(["docker", "image", "rm", image], check=True, capture_output=True)
    proc = subprocess.Popen([sys.executable, "-m", "rlbox.cli", "distribute", image, "--cluster", str(cluster)],
                            cwd=REPO, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "receiving" in line:
            break
    # Mid-transfer, whatever the machine's speed: the node's own save is running and held there
    # (SIGSTOP: 180 MB over loopback through warmed hops took less than the Ctrl-C's way down), so
    # the loads cannot be complete; it goes on once rlbox has ended, and meets its end at once.
    saves: list[int] = []
    for _ in range(200):
        saves = [int(line.split()[0]) for line in running(f"docker save -- {image}") if "pgrep" not in line]
        if saves:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the source node's docker save never started:\n" + "".join(seen))
    for pid in saves:
        os.kill(pid, signal.SIGSTOP)
    try:
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 130, "".join(seen) + rest
    finally:
        for pid in saves:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert rest.strip().splitlines()[-1].startswith("rlbox: error: interrupted;"), rest
    assert [h.image_id(image) for h in hosts[1:]] == [None, None]
    assert_no_leftovers()
    assert [line for line in running(f"docker save -- {image}") if "pgrep" not in line] == []
    for h in hosts[1:]:  # nothing loaded half
        assert h.docker("image", "ls", "-aq").stdout.strip() == ""


def test_test_engines_leave_the_machines_docker0_alone(hosts):
    """Engines of their own started in this network namespace must not delete docker0 (a dockerd
    with --bridge=none does, at start): every later container on the default network would fail."""
    if subprocess.run(["docker", "network", "inspect", "bridge"], capture_output=True).returncode != 0:
        pytest.skip("this engine has no default bridge network")
    assert subprocess.run(["ip", "link", "show", "docker0"], capture_output=True).returncode == 0
