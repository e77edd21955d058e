"""The environment rlbox makes from a verl release's PyPI wheel for that verl's own checks, with this
machine's CPU torch wheel where it keeps one (what pip's PIP_FIND_LINKS points at on these machines;
the same wheel the CPU training tests serve): made once, cached under RLBOX_CACHE."""

from __future__ import annotations

import os
from pathlib import Path

from rlbox.verl import own as verl_own, validate


def environment(version: str) -> tuple[validate.VerlTree, Path]:
    """(the wheel's config tree, the environment's Python) of verl ``version``."""
    from support.wheel_index import torch_wheel

    wheel, before = torch_wheel(), os.environ.get("PIP_FIND_LINKS")
    if wheel and str(wheel.parent) not in (before or "").split():
        os.environ["PIP_FIND_LINKS"] = " ".join(filter(None, [before, str(wheel.parent)]))
    try:
        return validate.from_wheel(version), verl_own.env_python(version)
    finally:
        if before is None:
            os.environ.pop("PIP_FIND_LINKS", None)
        else:
            os.environ["PIP_FIND_LINKS"] = before
