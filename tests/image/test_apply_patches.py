"""templates/files/rlbox-apply-patches run on this machine (its paths moved by RLBOX_SRC, RLBOX_PATCHES,
RLBOX_APPLIED): a component unpacked from a stand-in sdist has no .git and is patched all the same."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "templates" / "files" / "rlbox-apply-patches"
PATCH = "--- a/pkg/f.py\n+++ b/pkg/f.py\n@@ -1,2 +1,3 @@\n a\n b\n+c\n"


def apply(tmp_path: Path, *items: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "RLBOX_SRC": str(tmp_path / "src"), "RLBOX_PATCHES": str(tmp_path / "patches"),
           "RLBOX_APPLIED": str(tmp_path / "applied")}
    return subprocess.run(["bash", str(SCRIPT), "x", *items], env=env, cwd=tmp_path, capture_output=True, text=True)


def test_a_stand_in_sdist_is_patched_and_a_second_apply_names_the_sdist(tmp_path):
    (tmp_path / "src" / "x" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "x" / "pkg" / "f.py").write_text("a\nb\n")
    (tmp_path / "src" / "x" / ".rlbox-standin").write_text("x-1.0.tar.gz sha256:00\n")
    (tmp_path / "patches" / "x").mkdir(parents=True)
    (tmp_path / "patches" / "x" / "0001.patch").write_text(PATCH)
    item = f"{hashlib.sha256(PATCH.encode()).hexdigest()}=0001.patch"
    proc = apply(tmp_path, item)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "src" / "x" / "pkg" / "f.py").read_text() == "a\nb\nc\n"
    assert (tmp_path / "applied").read_text().startswith("x/0001.patch sha256:")
    proc = apply(tmp_path, item)
    assert proc.returncode == 1
    assert proc.stderr.startswith("rlbox error: patch x/0001.patch does not apply to x@the sdist x-1.0.tar.gz: ")
