"""A detached run's log keeper: from the job's submission on, a process of its own on this machine
follows the job's log (Ray's WebSocket tail, the node watch beside it) into runs/NAME/RUN_ID.log, so
the log survives the head's death even when nobody asked `rlbox status`, `logs` or `stop` first.

    python -m rlbox.cluster.follower RUNS_DIR NAME

It ends with the job, or with a lost node (the rest of the log read from the head first, then one
line saying where the log ends and why), or on SIGTERM (`rlbox stop`, which then copies the head's
whole log). Its pid is in RUN_ID.follower beside the log while it runs; `rlbox status` and
`rlbox logs` leave the log file to it meanwhile.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

MODULE = "rlbox.cluster.follower"


def pid_file(log: Path) -> Path:
    return log.with_suffix(".follower")


def alive(log: Path) -> int | None:
    """The pid of the follower keeping ``log``, if one runs."""
    try:
        pid = int(pid_file(log).read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError):
        return None
    return pid if MODULE in cmdline else None


def start(runs_dir: Path, name: str, log: Path) -> int:
    """Start the follower of run ``name`` in its own session (a Ctrl-C of the terminal that ran
    `rlbox run --detach` does not reach it); its own errors go to RUN_ID.follower.err."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log.with_suffix(".follower.err"), "ab") as errors:
        proc = subprocess.Popen([sys.executable, "-m", MODULE, str(runs_dir), name], stdin=subprocess.DEVNULL,
                                stdout=errors, stderr=errors, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
    return proc.pid


def stop(log: Path, wait: float = 5.0) -> bool:
    """SIGTERM the follower of ``log`` and wait for it to end; False when none ran."""
    pid = alive(log)
    if pid is None:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return False
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and alive(log) == pid:
        time.sleep(0.05)
    return True


def follow(runs_dir: Path, name: str) -> int:
    from rlbox.cluster import state as run_state
    from rlbox.cluster import watch
    from rlbox.cluster.hosts import connect_all
    from rlbox.cluster.jobs import JobsClient, LostContact, ended
    from rlbox.core import engine
    from rlbox.core.errors import RlboxError

    state = run_state.load(runs_dir, name)
    log = Path(state.log)
    pid_file(log).write_text(f"{os.getpid()}\n")
    nodes = []
    try:
        with log.open("a", encoding="utf-8") as out, engine.sigterm_as_interrupt():
            def write(text: str) -> None:
                out.write(text)
                out.flush()

            try:
                nodes = connect_all(state.hosts())
                client = JobsClient(state.dashboard(nodes[0]))
                looking = watch.Watch(watch.expected_of_record(state.nodes, state.addresses),
                                      [n["container"] for n in state.nodes], nodes, client.base)
                info = client.follow(state.submission_id, write, tick=looking.check, patience=30.0)
                write(f"rlbox: the job ended: {ended(info)}\n")
            except watch.NodeLost as lost:  # the rest of the log was read from the head, if it answered
                write(f"rlbox: the job's log ends here: {lost}\n")
            except LostContact as lost:
                write(f"rlbox: the job's log ends here: {lost}\n")
            except RlboxError as err:
                write(f"rlbox: the job's log ends here: {err}\n")
            except KeyboardInterrupt:  # rlbox stop: it copies the head's whole log next
                pass
    finally:
        for node in nodes:
            node.close()
        try:
            pid_file(log).unlink()
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(follow(Path(sys.argv[1]), sys.argv[2]))
