"""Doctor reads a remote host in one ssh session: every command's stdout, stderr and exit code
come back apart, whatever the commands print, and user text (a mount source) stays data."""

from __future__ import annotations

import subprocess

from rlbox.cluster.preflight.facts import batch_results, batch_script


def test_one_script_gives_every_command_its_own_output_and_exit_code(tmp_path):
    odd = tmp_path / "a dir; $(touch pwned) `x`"
    odd.mkdir()
    commands = [["ls", "-1", "/no/such/dir"], ["echo", "two words"], ["sh", "-c", "ulimit -Hn"],
                ["test", "-e", str(odd)], ["test", "-e", str(tmp_path / "absent")], ["printf", "no newline"],
                ["sh", "-c", "echo out; echo err >&2; exit 7"]]
    proc = subprocess.run(["sh", "-c", batch_script(commands)], capture_output=True, text=True, cwd=tmp_path)
    got = batch_results(commands, proc.stdout)
    assert [got[tuple(c)].returncode for c in commands] == [2, 0, 0, 0, 1, 0, 7]
    assert "No such file" in got[tuple(commands[0])].stderr and got[tuple(commands[0])].stdout == ""
    assert got[tuple(commands[1])].stdout == "two words\n"
    assert got[tuple(commands[2])].stdout.strip().isdigit() or got[tuple(commands[2])].stdout.strip() == "unlimited"
    assert got[tuple(commands[5])].stdout == "no newline"
    assert (got[tuple(commands[6])].stdout, got[tuple(commands[6])].stderr) == ("out\n", "err\n")
    assert not (tmp_path / "pwned").exists()


def test_commands_a_broken_session_never_reached_are_left_out():
    commands = [["echo", "a"], ["echo", "b"]]
    script = batch_script(commands).replace("{ echo b; }", "exit 0; { echo b; }")
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    got = batch_results(commands, proc.stdout)
    assert list(got) == [("echo", "a")]
