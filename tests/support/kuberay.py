"""The KubeRay test profile (tests/fixtures/kuberay/profile-a3.yaml) and edited copies of it."""

from __future__ import annotations

from pathlib import Path

import yaml

PROFILE = Path(__file__).resolve().parents[1] / "fixtures" / "kuberay" / "profile-a3.yaml"


def profile_with(tmp_path: Path, **changes) -> Path:
    """A copy of the test profile with top-level keys replaced, written under ``tmp_path``."""
    doc = yaml.safe_load(PROFILE.read_text())
    doc.update(changes)
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path
