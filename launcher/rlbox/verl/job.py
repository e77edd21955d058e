"""What rlbox knows of a verl job's command line and of what verl says about it: whether a command
runs verl (``python3 -m verl...`` or a recipe's ``-m recipe...``), the trainer keys the cluster's shape
sets, the override a restart resumes with, and verl's line that names the step it resumed from.
Pure: argv and text in, argv and values out; cluster/jobs.py plans and submits the job."""

from __future__ import annotations

import re

from rlbox.core.errors import RlboxError

MODULE = re.compile(r"^(verl\.|recipe\.)")  # what follows -m in a verl job

# verl's trainer on resume, _load_checkpoint: "Setting global step to N" (0.5-0.7); verl 0.9 logs
# "Resuming from .../global_step_N, setting global step to N"
RESUMED = re.compile(r"[Ss]etting global step to (\d+)")


def is_verl(argv: list[str]) -> bool:
    """Whether ``argv`` runs a verl module (``-m verl.…`` or ``-m recipe.…``)."""
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m" and MODULE.match(argv[i + 1]):
            return True
    return False


def required(argv: list[str] | None, command: str = "validate") -> list[str]:
    """``argv`` when it is a verl job, else the one line that says ``rlbox COMMAND`` needs one."""
    if argv is None or not is_verl(list(argv)):
        raise RlboxError(f"{command}: give a verl job (-- python3 -m verl.trainer.main_ppo ... or --recipe NAME)")
    return list(argv)


def sized(argv: list[str], nodes: int, npus: int) -> list[str]:
    """Set trainer.nnodes / trainer.n_gpus_per_node from the cluster; refuse a conflicting value."""
    want = {"trainer.nnodes": str(nodes), "trainer.n_gpus_per_node": str(npus)}
    seen = set()
    for arg in argv:
        key, sep, value = arg.lstrip("+").partition("=")
        if sep and key in want:
            seen.add(key)
            if value.strip("'\"") != want[key]:
                raise RlboxError(
                    f"{key}={value} conflicts with the cluster ({nodes} node(s) x {npus} NPUs): "
                    f"drop it, rlbox sets {key}={want[key]}"
                )
    return argv + [f"{k}={v}" for k, v in want.items() if k not in seen]


def resuming(argv: list[str]) -> list[str]:
    """A verl job with ``trainer.resume_mode=auto`` (any other resume_mode replaced), so verl resumes
    from the newest checkpoint in trainer.default_local_dir; any other command as it is."""
    if not is_verl(argv):
        return list(argv)
    return [a for a in argv if a.lstrip("+").partition("=")[0] != "trainer.resume_mode"] + ["trainer.resume_mode=auto"]


def resumed_step(text: str) -> int | None:
    """The step verl says it resumed from (``Setting global step to N``), if ``text`` says it."""
    found = RESUMED.search(text)
    return int(found.group(1)) if found else None
