"""A cached folder made once, under a lock, when several processes want it at the same moment."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from rlbox.core.once import STAMP, made_once


def _make_slowly(dest: str, log: str) -> str:
    def make(folder: Path) -> None:
        with open(log, "a") as f:
            f.write("made\n")
        (folder / "part").write_text("1")
        time.sleep(0.5)  # long enough that the other process arrives while this one makes it
        (folder / "whole").write_text("2")

    return str(made_once(Path(dest), "v1\n", make))


def test_two_processes_at_once_get_one_whole_folder_made_once(tmp_path):
    dest, log = tmp_path / "env", tmp_path / "log"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        got = pool.starmap(_make_slowly, [(str(dest), str(log))] * 2)
    assert got == [str(dest)] * 2
    assert log.read_text() == "made\n"
    assert (dest / "whole").read_text() == "2" and (dest / STAMP).read_text() == "v1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env", "env.lock", "log"]  # no half-made folder left


def test_a_half_made_or_stale_folder_is_made_again_and_a_failed_make_leaves_nothing(tmp_path):
    dest = tmp_path / "env"
    (dest / "bin").mkdir(parents=True)  # half-made: no stamp
    made_once(dest, "v1\n", lambda f: (f / "whole").write_text("1"))
    assert sorted(p.name for p in dest.iterdir()) == [STAMP, "whole"]
    made_once(dest, "v2\n", lambda f: (f / "new").write_text("2"))  # another plan: made again
    assert sorted(p.name for p in dest.iterdir()) == [STAMP, "new"]

    def fails(folder: Path) -> None:
        (folder / "x").write_text("x")
        raise RuntimeError("offline")

    with pytest.raises(RuntimeError, match="offline"):
        made_once(tmp_path / "other", "v1\n", fails)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env", "env.lock", "other.lock"]
