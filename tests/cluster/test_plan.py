"""Planning a run, without any engine: device lists, env, ports, quoting, jobs, recipes, dry-run."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from conftest import rlbox
from rlbox.cluster import spec as cluster
from rlbox.cluster import jobs
from rlbox.cluster import launch
from rlbox.cluster import plan
from rlbox.cluster import recipes
from rlbox.cluster import sim
from rlbox.core.errors import RlboxError

PROFILES = {
    "a2": plan.Profile("a2", 8, "910B", (8, 16)),
    "a3": plan.Profile("a3", 16, "Ascend910", (16,)),
}


def make(hosts="10.0.0.1,10.0.0.2", hardware="a3", devices=None, **kw):
    spec = cluster.from_hosts(hosts)
    profile = PROFILES[hardware]
    devices = devices or {h.name: profile.npus_per_node for h in spec.hosts}
    return plan.plan_run(spec, run="t", run_id="abcd", image="img:1", profile=profile, devices=devices, **kw)


def _devices(node):
    return [dst for _, dst in node.container.devices]


@pytest.mark.parametrize("hardware,count", [("a2", 8), ("a2", 16), ("a3", 16)])
def test_device_lists(hardware, count):
    p = make(hardware=hardware, devices={"10.0.0.1": count, "10.0.0.2": count})
    for node in p.nodes:
        assert _devices(node) == [f"/dev/davinci{i}" for i in range(count)] + list(plan.CONTROL_DEVICES)
        assert all(src == dst for src, dst in node.container.devices)  # real hosts: the device itself
        assert node.npus == count
        assert f'--resources={{"NPU": {count}}}' in node.ray
    assert p.total_npus == 2 * count


def test_driver_mounts_env_and_no_privileged():
    node = make().nodes[1]
    c = node.container
    mounts = {m.target: m for m in c.mounts}
    assert mounts["/usr/local/Ascend/driver"].read_only and mounts["/usr/local/Ascend/driver"].source == "/usr/local/Ascend/driver"
    for target in ("/usr/local/dcmi", "/usr/local/bin/npu-smi", "/etc/ascend_install.info"):
        assert target in mounts
    env = dict(c.env)
    for key, value in {"RAY_DEDUP_LOGS": "0", "HYDRA_FULL_ERROR": "1", "TASK_QUEUE_ENABLE": "1",
                       "HCCL_CONNECT_TIMEOUT": "3600", "HCCL_EXEC_TIMEOUT": "3600"}.items():
        assert env[key] == value
    assert c.network == "host" and c.ipc == "host"
    assert not c.privileged and "--privileged" not in c.docker_run()
    assert "--shm-size" not in c.docker_run()  # ignored under --ipc host: not pretended
    assert ("nofile", 65536, 65536) in c.ulimits
    labels = dict(c.labels)
    assert labels[plan.LABEL_RUN] == "t" and labels[plan.LABEL_RUN_ID] == "abcd" and labels[plan.LABEL_ROLE] == "worker"
    assert make(privileged=True).nodes[0].container.privileged


def test_socket_interface_detected_per_node_unless_overridden():
    spec = cluster.ClusterSpec((cluster.Host("10.0.0.1"), cluster.Host("10.0.0.2", nic="enp189s0f0")))
    p = plan.plan_run(spec, run="t", run_id="x", image="i", profile=PROFILES["a3"], devices={})
    assert "RLBOX_NIC" not in dict(p.nodes[0].container.env)  # detected inside: route to the head
    assert dict(p.nodes[1].container.env)["RLBOX_NIC"] == "enp189s0f0"
    assert "ip -o route get" in plan.NODE_SCRIPT and "HCCL_IF_IP" in plan.NODE_SCRIPT


def test_ray_ports_are_per_run_and_never_defaults():
    defaults = {6379, 8265, 10001, 52365, 8076, 44217, 44227}
    p = make()
    used = [v for k, v in p.ports.as_dict().items() if k != "workers"]
    assert not defaults & set(used) and len(set(used)) == len(used)
    assert plan.ports_for(0) == plan.ports_for(0) != plan.ports_for(8)
    head = " ".join(p.nodes[0].ray)
    assert f"--port={p.ports.gcs}" in head and f"--dashboard-port={p.ports.dashboard}" in head and "--head" in head
    worker = " ".join(p.nodes[1].ray)
    assert "--head" not in worker and p.head == "10.0.0.1"
    # the node script adds what it resolves on the node: the dashboard's address, the head's
    assert '--dashboard-host="$ip"' in plan.NODE_SCRIPT and '--address="$head:$port"' in plan.NODE_SCRIPT
    assert p.nodes[1].container.command[4:7] == ("worker", "10.0.0.1", str(p.ports.gcs))
    assert dict(p.nodes[0].container.env)["DASHBOARD_METRIC_PORT"] == str(p.ports.dashboard_metrics)


def test_hostile_paths_are_quoted_and_never_reach_a_shell():
    evil = "/data/my models/$(touch pwned);'x'"
    spec = cluster.ClusterSpec((cluster.Host("10.0.0.1"),), mounts=(cluster.Mount(evil, "/models", True),))
    p = plan.plan_run(spec, run="t", run_id="x", image="i", profile=PROFILES["a2"], devices={})
    c = p.nodes[0].container
    line = shlex.join(c.docker_run())
    assert shlex.split(line) == c.docker_run()  # the printed command is exactly the argv
    assert f"{evil}:/models:ro" in c.docker_run()
    mount = next(m for m in c.docker_py()["mounts"] if m["Target"] == "/models")
    assert (mount["Source"], mount["ReadOnly"], mount["Type"]) == (evil, True, "bind")
    assert c.command[:2] == ("bash", "-c") and c.command[2] == plan.NODE_SCRIPT  # constant script
    assert evil not in " ".join(c.command)


def test_head_names_resolve_and_loopback_heads_are_refused():
    assert make(hosts="localhost").head == "127.0.0.1"
    with pytest.raises(RlboxError, match="the head localhost resolves to 127.0.0.1, which other nodes cannot reach"):
        make(hosts="localhost,10.0.0.2")
    with pytest.raises(RlboxError, match="two mounts target /models"):
        spec = cluster.ClusterSpec((cluster.Host("10.0.0.1"),), mounts=(cluster.Mount("/a", "/models"), cluster.Mount("/b", "/models")))
        plan.plan_run(spec, run="t", run_id="x", image="i", profile=PROFILES["a2"], devices={})


def test_simulation_differs_only_in_devices_driver_files_and_network():
    net = plan.SimNetwork("rlbox-t")
    real = make()
    fake = make(sim_files="/tmp/sim", network=net)
    for r, s in zip(real.nodes, fake.nodes):
        assert [d for _, d in s.container.devices] == [d for _, d in r.container.devices]
        assert {src for src, _ in s.container.devices} == {"/dev/null"}
        assert [m.target for m in s.container.mounts] == [m.target for m in r.container.mounts]
        assert all(m.source.startswith("/tmp/sim/") for m in s.container.mounts[:4])
        assert s.container.network == "rlbox-t" and s.container.ip is None  # the engine gives the address
        assert dict(s.container.env).keys() == dict(r.container.env).keys()
        assert s.container.command[2:] != () and s.container.command[:3] == r.container.command[:3]
    assert fake.head == "rlbox-t-node0"  # found through the engine's DNS on the sim network
    assert fake.nodes[0].container.publish == (("127.0.0.1", fake.ports.dashboard, fake.ports.dashboard),)


def test_nnodes_set_from_cluster_and_conflicts_refused():
    job = jobs.plan_job(["python3", "-m", "verl.trainer.main_ppo", "trainer.device=npu"],
                        nodes=4, npus_per_node=16, run="t", run_id="x")
    assert job.argv[-2:] == ("trainer.nnodes=4", "trainer.n_gpus_per_node=16")
    same = jobs.plan_job(["python3", "-m", "recipe.dapo.main_dapo", "trainer.nnodes=4"],
                         nodes=4, npus_per_node=16, run="t", run_id="x")
    assert same.argv.count("trainer.nnodes=4") == 1
    with pytest.raises(RlboxError, match=r"trainer.nnodes=2 conflicts with the cluster \(4 node\(s\) x 16 NPUs\)"):
        jobs.plan_job(["python3", "-m", "verl.trainer.main_ppo", "trainer.nnodes=2"], nodes=4, npus_per_node=16, run="t", run_id="x")
    with pytest.raises(RlboxError, match="trainer.n_gpus_per_node=8 conflicts"):
        jobs.plan_job(["python3", "-m", "verl.trainer.main_ppo", "trainer.n_gpus_per_node=8"], nodes=1, npus_per_node=16, run="t", run_id="x")
    other = jobs.plan_job(["python3", "train.py", "trainer.nnodes=2"], nodes=4, npus_per_node=16, run="t", run_id="x")
    assert other.argv == ("python3", "train.py", "trainer.nnodes=2")  # not a verl entrypoint: untouched


def test_cluster_files(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# head first\n10.0.0.1\nops@10.0.0.2:2222  # worker\n")
    spec = cluster.from_file(hostfile)
    assert [h.name for h in spec.hosts] == ["10.0.0.1", "10.0.0.2"]
    assert (spec.hosts[1].ssh_user, spec.hosts[1].ssh_port) == ("ops", 2222)
    yml = tmp_path / "cluster.yaml"
    yml.write_text("image: verl_pt27_25rc3:a3-arm\nhardware: a3\nssh: {user: root}\nmounts: [/data]\n"
                   "hosts:\n  - host: 10.0.0.1\n    nic: eth1\n  - host: 10.0.0.2\n    ssh: {port: 2200}\n    mounts: ['/ckpt:/ckpt:ro']\n")
    spec = cluster.from_file(yml)
    assert spec.hardware == "a3" and spec.hosts[0].nic == "eth1" and spec.hosts[1].ssh_port == 2200
    assert spec.hosts[1].ssh_user == "root" and spec.hosts[1].mounts[0].read_only
    with pytest.raises(RlboxError, match="--nodes 3 disagrees with .* lists 2 host"):
        cluster.agree(spec, 3)
    yml.write_text("hosts:\n  - host: a\n    nick: eth0\n")
    with pytest.raises(RlboxError, match=r"cluster.yaml: hosts.0.nick: unknown key"):
        cluster.from_file(yml)
    with pytest.raises(RlboxError, match="listed twice"):
        cluster.from_hosts("a,b,a")


def test_every_recipe_loads_and_resolves():
    names = recipes.names_available()
    assert set(names) >= {"dapo-qwen3-32b-a3", "grpo-qwen2.5-0.5b-gsm8k", "grpo-qwen3-vl-8b-geo3k", "dapo-qwen3-8b-custom-reward"}
    for r in recipes.all_recipes():
        argv, env = r.resolve({}, [])
        text = " ".join(argv) + " ".join(env.values())
        assert "{{" not in text and "trainer.device=npu" in argv
        assert not any(a.startswith(("trainer.nnodes=", "trainer.n_gpus_per_node=")) for a in argv)
        for typo in ("tainer.", "alogorithm.", "actor_rolloput_ref."):
            assert typo not in text
    r = recipes.load("dapo-qwen3-32b-a3")
    argv, _ = r.resolve({"model_path": "/models/q32"}, ["data.train_batch_size=32"])
    assert "actor_rollout_ref.model.path=/models/q32" in argv
    assert "data.train_batch_size=32" in argv and "data.train_batch_size=64" not in argv
    with pytest.raises(RlboxError, match="has no parameter 'modle_path'"):
        r.resolve({"modle_path": "/x"}, [])
    with pytest.raises(RlboxError, match="unknown recipe 'dapo-qwen3-32b' \\(did you mean"):
        recipes.load("dapo-qwen3-32b")


def test_npu_smi_stand_in_matches_the_real_layout():
    table = sim.npu_smi_table("a2", 8, "23.0.7").splitlines()
    assert table[1] == "| npu-smi 23.0.7                   Version: 23.0.7                                               |"
    assert table[6].startswith("| 0     910B3               | OK            | ")
    assert table[7].startswith("| 0                         | 0000:C1:00.0  | 0           0    / 0          ")
    assert len({len(line) for line in table}) == 1 and len(table[0]) == 98
    a3 = sim.npu_smi_table("a3", 16, "25.3.rc1").splitlines()
    assert a3[4].startswith("| Chip  Phy-ID              | Bus-Id")
    assert a3[9].startswith("| 0     Ascend910           | OK            | -   ")  # die 1: no power
    assert a3[10].startswith("| 1     1                   | 0000:9F:00.0")
    assert sum("Ascend910" in line for line in a3) == 16
    assert sum("No running processes found in NPU" in line for line in a3) == 8


def test_dry_run_touches_no_host():
    env = {"DOCKER_HOST": "tcp://127.0.0.1:1", "RLBOX_RUNS_DIR": "/nonexistent/runs"}
    proc = rlbox("run", "--hosts", "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4", "--nodes", "4",
                 "--image", "verl_pt27_25rc3:a3-arm", "--mount", "/data", "--dry-run",
                 "--recipe", "dapo-qwen3-32b-a3", "--param", "model_path=/data/Qwen3-32B", env=env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("docker run --detach") == 4 and "4 node(s) x NPUs 16/16/16/16 = 64 NPUs" in out
    assert "--device /dev/davinci15" in out and "--volume /data:/data" in out
    assert "trainer.nnodes=4 trainer.n_gpus_per_node=16" in out
    assert "cd /opt/rlbox/src/verl && python3 -m recipe.dapo.main_dapo" in out
    assert "actor_rollout_ref.model.path=/data/Qwen3-32B" in out
    assert not Path("/nonexistent").exists()
    bad = rlbox("run", "--hosts", "a,b", "--nodes", "3", "--image", "verl_pt27_25rc3:a3-arm", "--dry-run",
                "--", "python3", "-m", "verl.trainer.main_ppo", "trainer.nnodes=3")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--nodes 3 disagrees" in bad.stderr
    bad = rlbox("run", "--hosts", "a,b", "--image", "verl_pt27_25rc3:a3-arm", "--dry-run",
                "--", "python3", "-m", "verl.trainer.main_ppo", "trainer.nnodes=3")
    assert bad.returncode == 2 and "trainer.nnodes=3 conflicts with the cluster (2 node(s) x 16 NPUs)" in bad.stderr


def test_launch_rejects_mixed_inputs():
    with pytest.raises(RlboxError, match="give one job"):
        launch.prepare(launch.RunRequest(sim=True, nodes=1, smoke_test=True, command=["true"], dry_run=True))
    with pytest.raises(RlboxError, match="--hardware a2 disagrees with image verl_pt27_25rc3:a3-arm"):
        launch.prepare(launch.RunRequest(hosts="a", image="verl_pt27_25rc3:a3-arm", hardware="a2", dry_run=True))
    with pytest.raises(RlboxError, match="no hosts"):
        launch.prepare(launch.RunRequest(image="verl_pt27_25rc3:a3-arm", dry_run=True))


def test_the_full_reference_a_variant_is_pushed_as_is_that_variant():
    """What ops engineers pull from SWR, named in full, is the same release as RELEASE:VARIANT: its hardware, the
    recipe's form on it (verl 0.9.1 has no recipe/ folder: DAPO runs main_ppo) and its NPU env policy."""
    swr = "swr.cn-south-1.myhuaweicloud.com/ascendhub/verl_pt210_cann910:a3-arm"
    plans = [launch.prepare(launch.RunRequest(hosts="10.0.0.1,10.0.0.2", image=image, recipe="dapo-qwen3-32b-a3",
                                              params=["model_path=/data/q"], dry_run=True))[0]
             for image in ("verl_pt210_cann910:a3-arm", swr)]
    for p in plans:
        assert p.image == swr and p.hardware == "a3" and p.image_ref == "verl_pt210_cann910:a3-arm"
        assert "verl.trainer.main_ppo" in p.job.argv and "reward.reward_manager.name=dapo" in p.job.argv, p.job.argv
        assert p.npu_policy is not None and p.npu_policy.release == "verl_pt210_cann910"
    assert plans[0].job.argv == plans[1].job.argv and plans[0].npu_policy == plans[1].npu_policy
    # any other reference is no variant: its hardware is asked for, and no release's form or policy is guessed
    with pytest.raises(RlboxError, match="--hardware: image registry.example/verl:x is not from the matrix"):
        launch.prepare(launch.RunRequest(hosts="a", image="registry.example/verl:x", dry_run=True, smoke_test=True))


def test_devices_by_id_choose_npus_ports_and_hccl_ranges():
    from rlbox.cluster import sharing

    assert sharing.parse_devices("8") == 8
    assert sharing.parse_devices("8-15") == tuple(range(8, 16))
    assert sharing.parse_devices("0,2,4,6") == (0, 2, 4, 6)
    assert sharing.parse_devices("0-3,8-11") == (0, 1, 2, 3, 8, 9, 10, 11)
    for bad in ("", "0-", "7-0", "0,0", "1-3,2", "0-32", "x", "-1", "0 - 7", "0", "33"):
        with pytest.raises(RlboxError, match="--devices"):
            sharing.parse_devices(bad)
    assert sharing.ids_text((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"
    low = make(devices={"10.0.0.1": tuple(range(8)), "10.0.0.2": tuple(range(8))})
    high = make(devices={"10.0.0.1": tuple(range(8, 16)), "10.0.0.2": tuple(range(8, 16))})
    assert [d for _, d in high.nodes[0].container.devices][:8] == [f"/dev/davinci{i}" for i in range(8, 16)]
    assert high.nodes[0].npus == 8 and high.total_npus == 16 and "--resources={\"NPU\": 8}" in high.nodes[0].ray
    lo_env, hi_env = dict(low.nodes[0].container.env), dict(high.nodes[0].container.env)
    keys = ("HCCL_IF_BASE_PORT", "HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE")
    assert all(lo_env[k] != hi_env[k] for k in keys)  # A3: all three, distinct per slot

    def span(v):
        a, _, b = v.partition("-")
        return set(range(int(a), int(b or a) + 1))
    ray_lo = set(range(low.ports.gcs, low.ports.worker_range[1] + 1))
    ray_hi = set(range(high.ports.gcs, high.ports.worker_range[1] + 1))
    hccl_lo = span(lo_env["HCCL_IF_BASE_PORT"]) | span(lo_env["HCCL_HOST_SOCKET_PORT_RANGE"]) | span(lo_env["HCCL_NPU_SOCKET_PORT_RANGE"])
    hccl_hi = span(hi_env["HCCL_IF_BASE_PORT"]) | span(hi_env["HCCL_HOST_SOCKET_PORT_RANGE"]) | span(hi_env["HCCL_NPU_SOCKET_PORT_RANGE"])
    assert not (ray_lo | hccl_lo) & (ray_hi | hccl_hi)
    # every slot's ports stay apart and under HCCL's 65520 limit
    every = [sharing.hccl_env(s, "a3") for s in range(sharing.MAX_NPU_ID + 1)]
    assert int(every[-1]["HCCL_NPU_SOCKET_PORT_RANGE"].split("-")[1]) <= 65520
    assert plan.ports_for(sharing.MAX_NPU_ID).worker_range[1] < sharing.HCCL_BASE
    a2 = make(hardware="a2", devices={"10.0.0.1": 8, "10.0.0.2": 8})
    assert "HCCL_IF_BASE_PORT" in dict(a2.nodes[0].container.env)
    assert "HCCL_HOST_SOCKET_PORT_RANGE" not in dict(a2.nodes[0].container.env)  # not with MC2 on A2
    assert "HCCL_IF_BASE_PORT=" in high.describe() and "(NPU 8-15)" in high.describe()


def test_unresolvable_head_is_planned_as_a_name():
    p = make(hosts="node-that-does-not-resolve.invalid,10.0.0.2")
    assert p.head == "node-that-does-not-resolve.invalid"
    assert any("does not resolve here" in n for n in p.notes)
    assert p.nodes[1].container.command[5] == "node-that-does-not-resolve.invalid"


def test_workers_past_the_first_eight_wait_for_the_launcher_s_go_not_a_clock():
    """No worker waits on a clock: the first 8 start as the head's ports answer, worker k past them
    when Ray's node table holds enough workers (2 more a registered worker)."""
    assert [plan.gated(i) for i in (0, 1, 8, 9, 15)] == [False, False, False, True, True]
    assert [plan.released(r) for r in (-1, 0, 1, 4)] == [8, 8, 10, 16]
    p = make(hosts=",".join(f"10.0.0.{i}" for i in range(1, 12)))
    env = [dict(n.container.env) for n in p.nodes]
    assert [e.get("RLBOX_GATED") for e in env] == [None] * 9 + ["1", "1"]
    assert not any("RLBOX_START_DELAY" in e for e in env)
    assert "trap 'go=1' USR1" in plan.NODE_SCRIPT.splitlines()[1]  # before anything that could take time


class _Api:
    """An engine's API as the gate calls it: the go file written, then the signal (a stopped container refuses it)."""

    def __init__(self, fail=(), stopped=(), unwritable=()):
        self.sent, self.written, self.fail, self.stopped, self.unwritable = [], [], set(fail), set(stopped), set(unwritable)

    def put_archive(self, name, path, data):
        import io
        import tarfile

        if name in self.fail or name in self.unwritable:
            raise RuntimeError("No such container: " + name)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            self.written.append((name, [f"{path}/{m.name}" for m in tar.getmembers()]))

    def kill(self, name, signal):
        if name in self.stopped or name in self.fail:
            raise RuntimeError(f"Container {name} is not running")
        self.sent.append((name, signal))


def test_the_gate_gives_each_go_once_as_ray_registers_workers():
    from types import SimpleNamespace

    from rlbox.cluster.bringup import Gate

    p = make(hosts=",".join(f"10.0.0.{i}" for i in range(1, 14)))  # workers 1..12; 9..12 gated
    api = _Api(fail={p.nodes[12].container.name}, stopped={p.nodes[10].container.name}, unwritable={p.nodes[11].container.name})
    said = []
    gate = Gate([(n, SimpleNamespace(client=SimpleNamespace(api=api))) for n in p.nodes], said.append)
    assert gate.give(registered=0) == [] and api.sent == [] and api.written == []
    assert gate.give(registered=1) == [9, 10]  # 10 is stopped: its go file is written, the signal refused
    assert gate.give() == [] and gate.give(registered=1) == []  # once
    assert gate.give(registered=3) == [11]  # 11's file could not be written, its signal went; 12 is gone: said, not raised
    go = {i: dict(p.nodes[i].container.env)["RLBOX_GO_FILE"] for i in (9, 10, 11, 12)}  # its own: run id and node
    assert go[9] == f"/tmp/rlbox-go-{p.run_id}-9" and len(set(go.values())) == 4
    assert sorted(api.written) == sorted((p.nodes[i].container.name, [go[i]]) for i in (9, 10))  # any order
    assert sorted(api.sent) == sorted((p.nodes[i].container.name, "SIGUSR1") for i in (9, 11))
    assert said == [f"{p.nodes[12].label}: cannot give it its go: No such container: {p.nodes[12].container.name}"]
    assert '[ -e "${RLBOX_GO_FILE:-}" ]' in plan.NODE_SCRIPT  # what the node script looks for


@pytest.mark.parametrize("machines, paced", [
    (["a", "b", "c"], False),  # each node on a machine of its own: every worker at once
    (["a"], False),
    (["a", "b", "a"], True),  # two share one machine's CPUs (the testbed's hosts, one kernel)
    (["a", None, "c"], True),  # one not known: as if shared
    ([None], True),
])
def test_workers_are_paced_only_where_nodes_share_a_machine(machines, paced):
    assert plan.paced(machines) is paced


def test_on_machines_of_their_own_every_gated_worker_gets_its_go_at_the_first_give():
    from types import SimpleNamespace

    from rlbox.cluster import bringup

    p = make(hosts=",".join(f"10.0.0.{i}" for i in range(1, 14)))  # workers 1..12; 9..12 gated
    api = _Api()

    def node(boot):
        return SimpleNamespace(client=SimpleNamespace(api=api), machine=lambda: boot)

    own = bringup.gate_for([(n, node(f"boot{i}")) for i, n in enumerate(p.nodes)], print)
    assert own.at_once and own.give(registered=-1) == [9, 10, 11, 12] and own.give() == []
    assert own.line() == "ray: workers past the first 8 start at once too (each node on a machine of its own)"
    shared = bringup.gate_for([(n, node("boot0" if i < 2 else f"boot{i}")) for i, n in enumerate(p.nodes)], print)
    assert not shared.at_once and shared.give(registered=0) == [] and shared.give(registered=1) == [9, 10]
    assert shared.line().startswith("ray: workers past the first 8 start as Ray registers the ones before them")
    small = make(hosts="10.0.0.1,10.0.0.2")  # no worker gated: nothing to say
    assert bringup.gate_for([(n, node("boot0")) for n in small.nodes], print).line() is None


def test_local_nodes_share_this_machine_so_a_simulation_is_paced():
    from rlbox.cluster.hosts import Node
    from rlbox.cluster.spec import Host

    machines = [Node(Host(f"sim{i}", transport="local"), client=None).machine() for i in range(3)]
    assert machines[0] and len(set(machines)) == 1 and plan.paced(machines)


def test_the_bring_up_phases_say_each_phase_from_the_end_of_the_one_before():
    from rlbox.cluster.bringup import Phases

    times = iter([10.0, 10.5, 12.0, 12.25, 20.0, 21.0])
    phases = Phases(clock=lambda: next(times))
    for phase in ("ssh", "pre-flight", "containers", "workers", "containers"):  # again: it adds up
        phases.mark(phase)
    assert phases.spent == {"ssh": 0.5, "pre-flight": 1.5, "containers": 0.25 + 1.0, "workers": 7.75}
    assert phases.line() == "bring-up: ssh 0.5 s, pre-flight 1.5 s, containers 1.2 s, workers 7.8 s"


def test_a_run_claims_a_host_whole_only_when_it_takes_every_npu_the_host_has():
    """Whole-host claims (sharing.claims) for a count read on the host (here the profile's, --dry-run) or a
    simulated host's every stand-in NPU; never for asked NPUs, nor an A2 simulated host's 8 of its 16."""
    def whole(**kw):
        plan, _ = launch.prepare(launch.RunRequest(dry_run=True, smoke_test=True, **kw))
        return [n.whole_host for n in plan.nodes]

    assert whole(hosts="10.0.0.1,10.0.0.2", image="verl_pt27_25rc3:a3-arm") == [True, True]
    assert whole(hosts="10.0.0.1,10.0.0.2", image="verl_pt27_25rc3:a3-arm", devices="0-7") == [False, False]
    assert whole(hosts="10.0.0.1", image="verl_pt27_25rc3:a3-arm", devices=16) == [False]
    assert whole(sim=True, nodes=2, hardware="a3") == [True, True]
    assert whole(sim=True, nodes=2, hardware="a2") == [False, False]  # 8 NPUs of a 16-NPU stand-in
    assert whole(sim=True, nodes=1, hardware="a2", devices="8-15") == [False]


def test_a_go_to_an_engine_that_does_not_answer_holds_neither_the_give_nor_the_other_gos(monkeypatch):
    """A gated worker's host cut off the network: its go (an engine call) would wait up to the client's
    120 s and, with it, the bring-up's loop and every other go. The give waits LOOK_WAIT for it, gives the
    others, does not send it again while it is out, and hands it over once it has come back."""
    import threading
    import time
    from types import SimpleNamespace

    from rlbox.cluster import bringup

    monkeypatch.setattr(bringup, "LOOK_WAIT", 0.2)
    p = make(hosts=",".join(f"10.0.0.{i}" for i in range(1, 13)))  # workers 9..11 gated
    release, api, calls = threading.Event(), _Api(), []

    class Hung(_Api):
        def put_archive(self, name, path, data):
            calls.append(name)
            release.wait(30)
            return super().put_archive(name, path, data)

    hung = Hung()
    gate = bringup.Gate([(n, SimpleNamespace(client=SimpleNamespace(api=hung if n.index == 10 else api)))
                         for n in p.nodes], print, at_once=True)
    began = time.monotonic()
    try:
        assert gate.give() == [9, 11] and time.monotonic() - began < 1.0
        assert gate.give() == [] and calls == [p.nodes[10].container.name]  # not sent again while out
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while (now := gate.give()) == [] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert now == [10] and calls == [p.nodes[10].container.name]
    assert hung.sent == [(p.nodes[10].container.name, "SIGUSR1")]


def test_a_go_goes_to_the_container_started_not_to_one_of_the_same_name_that_replaced_it():
    """A go still out when a restart took the cluster down must not reach the container of the same name
    the next bring-up made (that worker would start unpaced): the go is sent to the container's id."""
    from types import SimpleNamespace

    from rlbox.cluster import bringup

    p = make(hosts=",".join(f"10.0.0.{i}" for i in range(1, 11)))  # worker 9 gated
    api = _Api()
    gate = bringup.gate_for([(n, SimpleNamespace(client=SimpleNamespace(api=api), machine=lambda: None)) for n in p.nodes],
                            print, {9: "abc123"})
    assert gate.give(registered=1) == [9] and api.sent == [("abc123", "SIGUSR1")]
    assert api.written == [("abc123", [dict(p.nodes[9].container.env)["RLBOX_GO_FILE"]])]


def test_one_host_s_error_names_the_others_that_had_one():
    from rlbox.cluster.hosts import first_error

    from types import SimpleNamespace

    from rlbox.cluster.hosts import on_every

    def errors(*hosts):  # as on_every hands them over: each with the host it is about
        def fail(host):
            raise RlboxError(f"{host.name}: cannot list (y)", exit_code=3) if host.name == hosts[0] else \
                ValueError("no engine")
        return on_every(fail, [SimpleNamespace(name=h) for h in hosts])[1]

    one = errors("h1")[0]
    assert first_error([one]) is one and one.host == "h1"
    many = first_error(errors("h1", "h2", "h3", "h4", "h5", "h6", "h7", "h8"))
    assert str(many) == f"{one} (also on h2, h3, h4, h5, h6 and 2 more)" and many.exit_code == 3
    # nodes sharing one engine (a simulation) say their host once, the first's not again; IPv6 keeps its colons
    assert str(first_error(errors("h1", "h1", "fe80::1", "fe80::1"))) == f"{one} (also on fe80::1)"
    assert str(first_error(errors("h1", "h1"))) == str(one)
    # a host is named from what it is about, not read back from its error's words
    assert str(first_error([one, RlboxError("h9: x")])) == str(one)


def test_the_addresses_read_once_the_cluster_is_ready_wait_for_a_slow_engine_not_a_silent_one(monkeypatch):
    """The last read of the nodes' address lines (no look comes after it): a read still out is waited for
    while its engine answers its ping (loaded: the run's watch matches Ray's rows by that address), and
    left once the ping too is silent for ENGINE_PATIENCE (the watch names that engine)."""
    import threading
    import time
    from types import SimpleNamespace

    from rlbox.cluster import bringup

    monkeypatch.setattr(bringup, "LOOK_WAIT", 0.05)
    monkeypatch.setattr(bringup, "ENGINE_PATIENCE", 0.3)
    release = threading.Event()

    def node(read_takes: float, ping_hangs: bool, line: str):
        def get(name):
            time.sleep(read_takes) if read_takes else None
            if ping_hangs:
                release.wait(30)
            return SimpleNamespace(logs=lambda: line.encode())

        def ping():
            if ping_hangs:
                release.wait(30)
            return True
        return SimpleNamespace(client=SimpleNamespace(containers=SimpleNamespace(get=get), ping=ping))

    plans = [SimpleNamespace(index=i, container=SimpleNamespace(name=f"c{i}")) for i in range(3)]
    pairs = list(zip(plans, [node(0, False, "rlbox-node: head on 10.9.0.1 (eth0), head 10.9.0.1:1\n"),
                             node(0.6, False, "rlbox-node: worker on 10.9.0.2 (eth0), head 10.9.0.1:1\n"),
                             node(0, True, "")]))
    began = time.monotonic()
    try:
        assert bringup.addresses_said(bringup.address_reads(), pairs) == {0: "10.9.0.1"}  # a look's: 1 s at most
        assert time.monotonic() - began < 0.5
        reads = bringup.address_reads()
        assert bringup.addresses_said(reads, pairs, settle=True) == {0: "10.9.0.1", 1: "10.9.0.2"}
        assert time.monotonic() - began < 3.0 and set(reads.out) == {2}  # the silent one: left, still out
    finally:
        release.set()


def test_the_last_address_read_waits_for_an_engine_that_answers_pings_only_so_long(monkeypatch):
    """An engine that answers its ping but not the read (a stuck container lock): the read after the cluster
    is ready gives up after SETTLE_WAIT, not the client's 120 s."""
    import threading
    import time
    from types import SimpleNamespace

    from rlbox.cluster import bringup

    monkeypatch.setattr(bringup, "LOOK_WAIT", 0.05)
    monkeypatch.setattr(bringup, "SETTLE_WAIT", 0.4)
    release = threading.Event()
    stuck = SimpleNamespace(client=SimpleNamespace(containers=SimpleNamespace(get=lambda name: release.wait(30)),
                                                   ping=lambda: True))
    began = time.monotonic()
    try:
        pairs = [(SimpleNamespace(index=0, container=SimpleNamespace(name="c0")), stuck)]
        assert bringup.addresses_said(bringup.address_reads(), pairs, settle=True) == {}
        assert time.monotonic() - began < 2.0
    finally:
        release.set()
