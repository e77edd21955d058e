"""The workers' start pacing on real containers (ray_node.paced, bringup.Gate): simulated nodes share this
machine's kernel, so a simulation is paced; here each node is made to report a machine of its own (the one
fact the launcher reads, Node.machine), and the gated workers must then get their go at the launcher's first
poll of Ray's table, before any worker has registered, and join."""

from __future__ import annotations

import pytest

from support.engine import remove_test_runs

pytestmark = [pytest.mark.engine, pytest.mark.beside_sims]

NODES = 11  # the head, workers 1-8 started as the head answers, 9 and 10 gated


@pytest.fixture(autouse=True)
def no_leftovers():
    remove_test_runs("t35-")
    yield
    remove_test_runs("t35-")


def _bring_up(tmp_path, sim_image, name: str, machine):
    from rlbox.cluster import bringup, execute, hosts, launch

    cluster = tmp_path / f"{name}.yaml"  # hosts of its own: no claim of another group's runs in the way
    cluster.write_text("hosts:\n" + "".join(f"  - host: {name}-h{i}\n" for i in range(NODES)))
    plan, run_dir = launch.prepare(launch.RunRequest(cluster_file=cluster, sim=True, name=name, image=sim_image,
                                                     hardware="a3", devices=1, runs_dir=tmp_path / "runs"))
    gates: list[bringup.Gate] = []
    made = bringup.gate_for

    def gate_for(nodes, echo, ids=None):  # the gate the run makes, each go recorded with how many workers Ray had
        gate = made(nodes, echo, ids)  # when it was sent (its call may come back at a later give)
        give, gate.when = gate.give, {}

        def recorded(registered=None):
            before = set(gate.given)
            now = give(registered)
            gate.when.update((i, gate.registered) for i in gate.given - before)
            return now

        gate.give = recorded
        gates.append(gate)
        return gate

    said: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hosts.Node, "machine", machine)
        mp.setattr(bringup, "gate_for", gate_for)
        execute.execute(plan, run_dir=run_dir, echo=said.append, emit=lambda text: None, timeout=400, replace=True,
                        bring_up_only=True, keep=True)
    nodes = hosts.connect_all(tuple(p.host for p in plan.nodes))
    try:
        logs = [node.client.containers.get(p.container.name).logs().decode(errors="replace")
                for p, node in zip(plan.nodes, nodes)]
    finally:
        execute.remove_run(nodes, plan.run, plan.network.name if plan.network else None)
        for node in nodes:
            node.close()
    return plan, gates, said, logs


def test_workers_on_machines_of_their_own_get_their_go_at_once_and_join(tmp_path, sim_image):
    plan, gates, said, logs = _bring_up(tmp_path, sim_image, "t35-own", lambda node: f"boot-of-{node.host.name}")
    assert [g.at_once for g in gates] == [True]
    assert gates[0].when == {9: 0, 10: 0}  # both before Ray had registered any worker
    assert any(line.startswith("cluster ready") for line in said), said[-5:]
    assert "ray: workers past the first 8 start at once too (each node on a machine of its own)" in said
    assert f"ray: {NODES}/{NODES} nodes, {NODES}/{NODES} NPUs" in said
    for index in (9, 10):  # each waited for its go, and joined (every node is in Ray's table: the line above)
        assert "waiting for the launcher's go" in logs[index], logs[index][-800:]


def test_a_node_whose_machine_is_not_known_keeps_the_pacing(tmp_path, sim_image):
    """A host whose shell could not read its boot id: as if it shared a machine (each go as Ray registers)."""
    plan, gates, said, logs = _bring_up(tmp_path, sim_image, "t35-unknown",
                                        lambda node: None if node.host.name.endswith("-h3") else f"boot-{node.host.name}")
    assert [g.at_once for g in gates] == [False] and set(gates[0].when) == {9, 10}
    assert any(line.startswith("ray: workers past the first 8 start as Ray registers") for line in said)
    assert min(gates[0].when.values()) >= 1  # each once Ray had registered workers before it (ray_node.released)
    assert f"ray: {NODES}/{NODES} nodes, {NODES}/{NODES} NPUs" in said
