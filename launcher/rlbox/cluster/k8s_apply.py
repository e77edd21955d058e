"""Carrying a RayJob plan out, and asking after it: `kubectl apply -f -` with the manifest on
stdin, `kubectl get/delete rayjob`, `kubectl logs` (kubectl from PATH, or RLBOX_KUBECTL; its
cluster and credentials are kubectl's own kubeconfig, its context the one recorded at apply).
Decides nothing: a failure is one line naming the command."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable

from rlbox.cluster.kuberay import RayJobPlan
from rlbox.core.errors import RlboxError, last_line

REQUEST_TIMEOUT = "30s"  # kubectl's own limit on each request of get/delete (an unreachable cluster)


def kubectl_path() -> str:
    kubectl = os.environ.get("RLBOX_KUBECTL", "kubectl")
    if shutil.which(kubectl) is None:
        raise RlboxError(f"{kubectl} not found: install kubectl (Debian: kubernetes-client), or write the manifest with "
                         "`rlbox k8s export ... -o FILE` and apply it where kubectl is")
    return kubectl


def apply(plan: RayJobPlan) -> str:
    """Apply the manifest; kubectl's answer (``rayjob.ray.io/NAME created``)."""
    kubectl = kubectl_path()
    proc = subprocess.run([kubectl, "apply", "-f", "-"], input=plan.describe(), capture_output=True, text=True,
                          check=False)
    if proc.returncode:
        raise RlboxError(f"kubectl apply of RayJob {plan.namespace}/{plan.name} failed: {last_line(proc.stderr or proc.stdout)}")
    return proc.stdout.strip()


def current_context() -> str | None:
    """kubectl's current context (from its kubeconfig, no cluster asked); None when it has none."""
    try:
        proc = subprocess.run([kubectl_path(), "config", "current-context"], capture_output=True, text=True,
                              check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode:
        return None
    return proc.stdout.strip() or None


def _argv(args: list[str], context: str | None) -> list[str]:
    return [kubectl_path(), *([f"--context={context}"] if context else []), *args]


def _failed(args: list[str], said: str) -> RlboxError:
    return RlboxError(f"`kubectl {shlex.join(args)}` failed: {last_line(said) or 'no answer'}")


def run(args: list[str], context: str | None = None) -> str:
    """kubectl ARGS (one request at a time, each limited by REQUEST_TIMEOUT); its stdout."""
    full = [*args, f"--request-timeout={REQUEST_TIMEOUT}"]
    try:
        proc = subprocess.run(_argv(full, context), capture_output=True, text=True, check=False, timeout=120)
    except subprocess.TimeoutExpired:
        raise _failed(args, "no answer in 120 s") from None
    if proc.returncode:
        raise _failed(args, proc.stderr or proc.stdout or f"exit {proc.returncode}")
    return proc.stdout


def stream(args: list[str], write: Callable[[str], None], context: str | None = None) -> tuple[bool, str]:
    """kubectl ARGS with its stdout passed to WRITE line by line as it comes (`kubectl logs -f`):
    whether it wrote anything, and what kubectl said on stderr."""
    proc = subprocess.Popen(_argv(args, context), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wrote = False
    try:
        assert proc.stdout is not None and proc.stderr is not None
        for line in proc.stdout:
            wrote = True
            write(line)
        said = proc.stderr.read()
        rc = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        raise
    if rc:
        raise _failed(args, said or f"exit {rc}")
    return wrote, said
