"""Carrying a RayJob plan out: `kubectl apply -f -` with the manifest on stdin (kubectl from
PATH, or RLBOX_KUBECTL; its context and credentials are kubectl's own). Decides nothing."""

from __future__ import annotations

import os
import shutil
import subprocess

from rlbox.cluster.kuberay import RayJobPlan
from rlbox.core.errors import RlboxError, last_line


def apply(plan: RayJobPlan) -> str:
    """Apply the manifest; kubectl's answer (``rayjob.ray.io/NAME created``)."""
    kubectl = os.environ.get("RLBOX_KUBECTL", "kubectl")
    if shutil.which(kubectl) is None:
        raise RlboxError(f"{kubectl} not found: install kubectl, or write the manifest with "
                         "`rlbox k8s export ... -o FILE` and apply it where kubectl is")
    proc = subprocess.run([kubectl, "apply", "-f", "-"], input=plan.describe(), capture_output=True, text=True,
                          check=False)
    if proc.returncode:
        raise RlboxError(f"kubectl apply of RayJob {plan.namespace}/{plan.name} failed: {last_line(proc.stderr or proc.stdout)}")
    return proc.stdout.strip()
