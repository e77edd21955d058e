"""The shell on the engine tunnel's ssh session (rlbox.cluster.agent), driven here through a local
process with the same stdin/stdout (over ssh it is the same program: tests/testbed run it there)."""

import subprocess

import pytest

from rlbox.cluster import agent
from rlbox.cluster.preflight.facts import batch_results, batch_script


@pytest.fixture
def shell():
    token = agent.new_token()
    # what a user's shell rc prints before the command runs is not an answer
    proc = subprocess.Popen(["sh", "-c", 'echo "welcome from .bashrc"; exec "$@"', "rc", *agent.argv(token)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    yield agent.Agent(proc, token, "h1")
    proc.stdin.close()
    proc.wait(timeout=5)


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
    with pytest.raises(subprocess.TimeoutExpired):
        shell.run("sleep 3", timeout=0.5)
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
