"""`rlbox testbed up --slurm`, planned: slurm.conf names every host by its address, gres.conf the
host's own NPU stand-ins, the daemons run in the hosts' namespaces, and the cluster file names host 1
as Slurm's login node (read back by the strict cluster-file reader)."""

from __future__ import annotations

from pathlib import Path

from rlbox.cluster import spec
from rlbox.testbed.plan import plan_testbed
from rlbox.testbed.slurm import PARTITION, plan_slurm


def _plan(**kw):
    return plan_testbed(hosts=3, hardware="a3", name="tbsl", subnet="10.214.1.0/24", slurm=True, **kw)


def test_slurm_conf_names_every_host_by_address_and_whole_nodes():
    conf = plan_slurm(_plan(host_devices=("3=8",)), cpus=2).slurm_conf()
    assert "SlurmctldHost=h1(10.214.1.1)" in conf
    for i, npus in ((1, 16), (2, 16), (3, 8)):
        assert f"NodeName=h{i} NodeAddr=10.214.1.{i} NodeHostname=h{i} CPUs=2 RealMemory=1000 Gres=npu:{npus}" in conf
    assert f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" in conf
    for setting in ("ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "GresTypes=npu",
                    "AccountingStorageType=accounting_storage/none", "StateSaveLocation=/var/lib/rlbox-testbed/tbsl/slurm/state"):
        assert setting in conf.splitlines()
    assert "cgroup" not in conf


def test_gres_conf_is_each_hosts_own_stand_ins():
    gres = plan_slurm(_plan(host_devices=("2=1", "3=8"))).gres_conf().splitlines()[1:]
    assert gres == ["NodeName=h1 Name=npu File=/dev/davinci[0-15]", "NodeName=h2 Name=npu File=/dev/davinci0",
                    "NodeName=h3 Name=npu File=/dev/davinci[0-7]"]


def test_daemons_run_inside_the_hosts_with_their_node_names():
    p = plan_slurm(_plan())
    h2 = p.testbed.hosts[1]
    argv = p.daemon_argv(h2, 42, "slurmd")
    assert argv[:6] == ["nsenter", "--target=42", "--mount", "--net", "--pid", "--"]
    assert argv[6:8] == ["unshare", "--uts"] and argv[-1] == "h2" and "exec slurmd -N h2" in argv[-3]
    assert "exec slurmctld" in p.daemon_argv(p.controller, 7, "slurmctld")[-3]
    described = _plan().describe()
    assert described.count("munged --force") == 3 and described.count("exec slurmd") == 3
    assert described.count("exec slurmctld") == 1


def test_cluster_file_names_the_login_node(tmp_path: Path):
    plan = _plan(root=str(tmp_path))
    Path(plan.dir).mkdir()
    for made in (plan.identity_file, plan.known_hosts):  # what `up` writes before the cluster file
        Path(made).write_text("")
    f = tmp_path / "cluster.yaml"
    f.write_text(plan.cluster_yaml())
    read = spec.from_file(f)
    assert (read.slurm_login, read.slurm_partition) == ("10.214.1.1", "rlbox")
    assert [h.name for h in read.hosts] == ["10.214.1.1", "10.214.1.2", "10.214.1.3"]
    assert "slurm:" not in plan_testbed(hosts=1, hardware="a3", name="tbsl", subnet="10.214.1.0/24").cluster_yaml()
