"""What a test left on the engine, found by rlbox's labels (docker-stacks' TrackedContainer idea:
every container and network rlbox makes is labelled, so cleanup and "nothing left" checks never
guess by name)."""

from __future__ import annotations

import docker

MANAGED = "io.rlbox.managed"
RUN = "io.rlbox.run"
SERVE = "io.rlbox.serve"
TASK = "io.rlbox.task"


def labelled(key: str, value: str = "true") -> list:
    """Every container, running or not, carrying label ``key=value``."""
    return docker.from_env().containers.list(all=True, ignore_removed=True, filters={"label": f"{key}={value}"})


def names(key: str, value: str = "true") -> list[str]:
    return [b.name for b in labelled(key, value)]


def claims(run: str) -> list[tuple[str, str]]:
    """Run ``run``'s claims (its name, each node's NPUs, its port block): each one's name and the run id
    holding it."""
    return sorted((b.name, b.labels.get("io.rlbox.claim-run-id", "")) for b in labelled("io.rlbox.claim", run))


def claim_race(runs: list, timeout: float) -> dict:
    """Each (plan, nodes) of ``runs`` claimed at the same moment, one thread a run (sharing.claim): by run
    name, how many claims it took, or the text of its refusal."""
    import threading

    from rlbox.cluster import sharing

    start, outcome = threading.Barrier(len(runs)), {}

    def one(plan, nodes):
        start.wait()
        try:
            outcome[plan.run] = sharing.claim(plan, nodes)
        except Exception as err:  # noqa: BLE001 - the loser's refusal, read by the test
            outcome[plan.run] = str(err)

    threads = [threading.Thread(target=one, args=r) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    return outcome


def remove_labelled(key: str, value: str = "true") -> None:
    for box in labelled(key, value):
        box.remove(force=True)


def leftovers(run: str) -> list[str]:
    """Containers and the simulation network of run ``run`` still on the engine."""
    nets = docker.from_env().networks.list(names=[f"rlbox-{run}"])
    return names(RUN, run) + [n.name for n in nets if n.name == f"rlbox-{run}"]


def remove_run(run: str) -> None:
    """Remove run ``run``'s containers and its simulation network."""
    remove_labelled(RUN, run)
    for net in docker.from_env().networks.list(names=[f"rlbox-{run}"]):
        if net.name == f"rlbox-{run}":  # the engine matches names by substring
            net.remove()


def remove_test_runs(prefix: str = "t-") -> None:
    """Remove every rlbox container (claims too: a run killed mid-way leaves them) and network of runs
    named ``prefix``... (tests' own runs only)."""
    client = docker.from_env()
    for box in labelled(MANAGED):
        if box.labels.get(RUN, "").startswith(prefix) or box.labels.get("io.rlbox.claim", "").startswith(prefix):
            try:
                box.remove(force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as err:  # 409: its removal (rlbox's own teardown) is under way
                if err.status_code != 409:
                    raise
    for net in client.networks.list(filters={"label": f"{MANAGED}=true"}):
        if net.name.startswith(f"rlbox-{prefix}"):
            net.remove()
