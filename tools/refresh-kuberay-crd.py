#!/usr/bin/env python3
"""Vendor KubeRay's RayJob v1 OpenAPI schema for the manifest tests.

Reads ray-operator/config/crd/bases/ray.io_rayjobs.yaml at a KubeRay release tag and writes its
``ray.io/v1`` ``openAPIV3Schema`` to tests/fixtures/kuberay/rayjob-v1-openapi.json, with the
release, the tag's commit and the source path recorded beside it.

    tools/refresh-kuberay-crd.py v1.7.0                      # shallow clone from GitHub
    tools/refresh-kuberay-crd.py v1.7.0 --git-dir /path/to/kuberay/.git
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

CRD = "ray-operator/config/crd/bases/ray.io_rayjobs.yaml"
URL = "https://github.com/ray-project/kuberay"
OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kuberay" / "rayjob-v1-openapi.json"


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True, text=True).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("version", help="KubeRay release tag, e.g. v1.7.0")
    ap.add_argument("--git-dir", help="an existing KubeRay git directory (default: a shallow clone of the tag)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        git_dir = args.git_dir
        if not git_dir:
            subprocess.run(["git", "clone", "--quiet", "--bare", "--depth", "1", "--branch", args.version, URL,
                            f"{tmp}/kuberay.git"], check=True)
            git_dir = f"{tmp}/kuberay.git"
        commit = git(git_dir, "rev-parse", f"{args.version}^{{commit}}").strip()
        crd = yaml.safe_load(git(git_dir, "show", f"{commit}:{CRD}"))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    doc = {"kuberay_version": args.version, "source_commit": commit, "source": f"{URL}/blob/{commit}/{CRD}",
           "crd": crd["metadata"]["name"], "api_version": f"{crd['spec']['group']}/v1",
           "openAPIV3Schema": version["schema"]["openAPIV3Schema"]}
    OUT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(OUT.parents[3])}: KubeRay {args.version} ({commit[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
