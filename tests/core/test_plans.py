"""Every plan keeps one contract (rlbox.core.plan.Plan): describe() for a person, as_dict() for
JSON. Found by name across the package, so a new *Plan class cannot forget it; and real plans
made by the planners turn into JSON and text without touching a host."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil

import pytest

import rlbox
from rlbox.cluster import launch
from rlbox.core.plan import Plan
from rlbox.image import build, transfer

PARTS = {"NodePlan"}  # a part of RunPlan, described and serialized by it


def plan_classes():
    found = {}
    for info in pkgutil.walk_packages(rlbox.__path__, "rlbox."):
        if ".scripts" in info.name or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and name.endswith("Plan") and obj.__module__ == module.__name__ and name not in PARTS:
                found[f"{module.__name__}.{name}"] = obj
    return found


def test_plan_classes_are_found():
    names = {n.rsplit(".", 1)[1] for n in plan_classes()}
    assert {"RunPlan", "JobPlan", "BuildPlan", "PushPlan", "DataPlan", "MergePlan", "ServePlan", "EvalPlan"} <= names


@pytest.mark.parametrize("name", sorted(plan_classes()))
def test_every_plan_describes_itself_and_serializes(name):
    cls = plan_classes()[name]
    for method in ("describe", "as_dict"):
        assert callable(getattr(cls, method, None)), f"{name} has no {method}(): every plan keeps rlbox.core.plan.Plan"


def test_real_plans_are_text_and_json(m):
    run, _ = launch.prepare(launch.RunRequest(sim=True, nodes=2, hardware="a3", smoke_test=True, dry_run=True))
    variant = m.get("rlbox_sim:amd64")
    built = build.plan(variant, revision="abc")
    pushed = transfer.plan_push(m, "rlbox_sim:amd64", {"org.opencontainers.image.revision": "0" * 40},
                                registry_host="127.0.0.1:5000")
    for p in (run, run.job, built, pushed):
        assert isinstance(p, Plan)
        assert p.describe().strip()
        json.dumps(p.as_dict())
    assert pushed.tags == ("amd64", "amd64-000000000000")
    assert pushed.as_dict()["repository"] == "127.0.0.1:5000/rlbox/sim"
