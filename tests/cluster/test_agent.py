"""The shell on the engine tunnel's ssh session (rlbox.cluster.agent), driven here through a local
process with the same stdin/stdout (over ssh it is the same program: tests/testbed run it there)."""

import shlex
import subprocess

import pytest

from rlbox.cluster import agent
from rlbox.cluster.preflight.facts import batch_results, batch_script


def _start(token: str) -> subprocess.Popen:
    # as sshd runs it: the user's login shell parses the command line ssh was given (shlex.join of the argv);
    # what its rc prints before the command runs is not an answer
    line = shlex.join(agent.argv(token))
    return subprocess.Popen(["bash", "-c", f'echo "welcome from .bashrc"; {line}'],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture
def shell():
    token = agent.new_token()
    proc = _start(token)
    yield agent.Agent(proc, token, "h1")
    proc.stdin.close()
    proc.wait(timeout=5)


def test_its_command_line_is_one_line_without_single_quotes():
    """csh and tcsh (some sites' login shells) refuse a newline inside quotes; shlex.join quotes with '."""
    assert "\n" not in agent.SHELL and "'" not in agent.SHELL
    assert "\n" not in shlex.join(agent.argv(agent.new_token()))


@pytest.mark.parametrize("login", ["bash", "sh", "tcsh"])
def test_it_starts_under_each_kind_of_login_shell(login):
    """sshd hands the command line to the user's login shell; csh and tcsh (some HPC sites' default) refuse a
    newline inside quotes: the multi-line form died there at once ("Unmatched"), where `cat` had worked."""
    import os
    import shutil

    if shutil.which(login) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{login} missing: .ci/provision installs it")
        pytest.skip(f"{login} is not installed here")
    token = agent.new_token()
    proc = subprocess.Popen([login, "-c", shlex.join(agent.argv(token))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        shell = agent.Agent(proc, token, "h1")
        with open("/proc/sys/kernel/random/boot_id") as f:
            assert shell.machine() == f.read().strip()  # its first line, as this login shell passed it on
        assert shell.run("echo it\\'s; printf '%s\\n' \"$0\"", timeout=10) == (0, "it's\nsh\n")
    finally:
        proc.stdin.close()
        proc.wait(timeout=5)


def test_it_says_the_host_kernel_s_boot_id_before_any_script(shell):
    """Which machine's CPUs the host's containers share (ray_node.paced), read by the shell's own `read`."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    assert shell.machine() == boot
    assert shell.run("echo after", timeout=10) == (0, "after\n") and shell.machine() == boot


def test_a_host_without_a_boot_id_is_a_machine_not_known():
    line = shlex.join(agent.argv(token := agent.new_token())).replace("/proc/sys/kernel/random/boot_id", "/nonexistent")
    proc = subprocess.Popen(["bash", "-c", line], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        shell = agent.Agent(proc, token, "h1")
        assert shell.machine() is None and shell.run("echo ok", timeout=10) == (0, "ok\n")
    finally:
        proc.stdin.close()
        proc.wait(timeout=5)


def test_it_answers_on_descriptors_past_1023():
    """1,000 hosts hold ~4 descriptors each: select() cannot wait on one numbered past 1023."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard open-files limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    token = agent.new_token()
    proc = _start(token)
    try:
        assert proc.stdout.fileno() > 1023
        assert agent.Agent(proc, token, "h1").run("echo far", timeout=10) == (0, "far\n")
    finally:
        proc.stdin.close()
        proc.wait(timeout=5)
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_interrupt_mid_answer_leaves_it_refusing_not_out_of_step(shell, monkeypatch):
    real = agent.Agent._read_until

    def interrupted(self, mark, deadline, timeout):
        if mark.startswith(b"\n"):
            raise KeyboardInterrupt
        return real(self, mark, deadline, timeout)

    monkeypatch.setattr(agent.Agent, "_read_until", interrupted)
    with pytest.raises(KeyboardInterrupt):
        shell.run("echo first", timeout=5)
    monkeypatch.setattr(agent.Agent, "_read_until", real)
    with pytest.raises(subprocess.SubprocessError, match="stopped answering"):
        shell.run("echo second", timeout=5)  # never "first" as its answer


def test_scripts_run_one_after_another_with_their_status_and_output(shell):
    assert shell.run("echo one; echo two >&2; exit 3", timeout=5) == (3, "one\ntwo\n")
    assert shell.run("printf 'no newline'", timeout=5) == (0, "no newline")
    assert shell.run("cat; echo read-nothing", timeout=5) == (0, "read-nothing\n")  # no stdin: the frame is safe
    assert shell.run("x='a\\b  c'; printf '%s\\n' \"$x\"", timeout=5) == (0, "a\\b  c\n")


def test_the_pre_flight_batch_reads_back_the_same_over_it(shell):
    commands = [["echo", "it's $HOME; `x`"], ["sh", "-c", "echo err >&2; exit 2"], ["printf", "%s", ""]]
    _, out = shell.run(batch_script(commands), timeout=10)
    got = batch_results(commands, out)
    assert got[tuple(commands[0])].stdout == "it's $HOME; `x`\n"
    assert (got[tuple(commands[1])].returncode, got[tuple(commands[1])].stderr) == (2, "err\n")
    assert got[tuple(commands[2])].stdout == ""


def test_a_script_past_its_timeout_leaves_the_shell_refusing_plainly(shell):
    with pytest.raises(subprocess.TimeoutExpired, match="timed out after 0.5 seconds"):
        shell.run("sleep 2", timeout=0.5)
    assert shell.broken
    with pytest.raises(subprocess.SubprocessError, match="ssh h1: the shell on the tunnel stopped answering"):
        shell.run("echo again", timeout=5)


def test_the_session_ending_is_an_error_naming_the_host(shell):
    with pytest.raises(subprocess.SubprocessError, match="ssh h1: the session ended"):
        shell.run("kill -9 $PPID", timeout=5)


def test_closing_its_stdin_ends_it_as_cat_ended_the_tunnel(shell):
    assert shell.run("true", timeout=5)[0] == 0
    shell.proc.stdin.close()
    assert shell.proc.wait(timeout=5) == 0
