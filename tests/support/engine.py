"""What a test left on the engine, found by rlbox's labels (docker-stacks' TrackedContainer idea:
every container and network a test makes is labelled, so cleanup never guesses by name)."""

from __future__ import annotations

import docker

MANAGED = "io.rlbox.managed"
RUN = "io.rlbox.run"


def leftovers(name: str) -> list[str]:
    """Containers and the simulation network of run ``name`` still on the engine."""
    client = docker.from_env()
    boxes = client.containers.list(all=True, filters={"label": f"{RUN}={name}"})
    nets = client.networks.list(names=[f"rlbox-{name}"])
    return [b.name for b in boxes] + [n.name for n in nets]


def remove_test_runs(prefix: str = "t-") -> None:
    """Remove every rlbox container and network of runs named ``prefix``... (tests' own runs only)."""
    client = docker.from_env()
    for box in client.containers.list(all=True, filters={"label": f"{MANAGED}=true"}):
        if box.labels.get(RUN, "").startswith(prefix):
            box.remove(force=True)
    for net in client.networks.list(filters={"label": f"{MANAGED}=true"}):
        if net.name.startswith(f"rlbox-{prefix}"):
            net.remove()
