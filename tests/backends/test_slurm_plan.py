"""The Slurm backend's planning and judgements, as tables over Slurm's own answers (the texts
below are what Debian's slurm-wlm 22.05 said on the testbed): a wrong partition, more nodes than
the cluster has, a dead controller each give one line naming it."""

from __future__ import annotations

import shlex

import pytest

from rlbox.backends.slurm import plan as sp
from rlbox.core.errors import RlboxError

SINFO = "rlbox* 4 up\nbig 2 up\nold 1 down\n"


def _plan(**kw):
    return sp.plan_slurm(**({"name": "verl", "nodes": 2, "partition": None, "time": None} | kw))


def test_batch_script_quotes_every_value_and_holds_the_nodes():
    plan = _plan(name="sl-a", nodes=4, partition="npu", time="2:00:00", npus=16, login="10.0.0.1")
    script = plan.batch_script()
    assert "#SBATCH --nodes=4" in script and "#SBATCH --partition=npu" in script and "#SBATCH --gres=npu:16" in script
    assert "#SBATCH --time=2:00:00" in script and "#SBATCH --exclusive" not in script  # GRES: the node may be shared
    assert "#SBATCH --exclusive" in _plan(name="sl-a", nodes=4).batch_script()  # whole nodes
    assert plan.sbatch_argv()[:2] == ["sbatch", "--parsable"] and "--job-name=rlbox-sl-a" in plan.sbatch_argv()
    for line in script.splitlines():
        if line.startswith("echo "):
            assert shlex.split(line)[1] == "rlbox run sl-a: nodes"
    described = plan.describe()
    assert "on 10.0.0.1 (ssh)" in described and script.splitlines()[0] in described


@pytest.mark.parametrize("kw, line", [
    ({"nodes": None}, "--backend slurm: give --nodes N"),
    ({"partition": "a b"}, "--partition 'a b': a partition name is letters"),
    ({"partition": "$(reboot)"}, "--partition '$(reboot)'"),
    ({"time": "soon"}, "--time 'soon': Slurm's time format"),
    ({"time": "1;rm"}, "--time '1;rm'"),
])
def test_bad_options_are_one_line(kw, line):
    with pytest.raises(RlboxError) as e:
        _plan(**kw)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


@pytest.mark.parametrize("time", ["10", "30:00", "2:00:00", "1-12", "1-12:30", "1-12:30:00", "INFINITE"])
def test_slurm_time_formats(time):
    assert _plan(time=time).time == time


@pytest.mark.parametrize("kw, rc, out, err, answer", [
    ({}, 0, SINFO, "", "rlbox"),
    ({"partition": "big"}, 0, SINFO, "", "big"),
    ({"nodes": 4}, 0, SINFO, "", "rlbox"),
    ({"partition": "nope"}, 0, SINFO, "", "--partition nope: Slurm has no such partition (it has big, old, rlbox)"),
    ({"nodes": 5}, 0, SINFO, "", "--nodes 5: partition rlbox has 4 node(s)"),
    ({"partition": "big", "nodes": 3}, 0, SINFO, "", "--nodes 3: partition big has 2 node(s)"),
    ({"partition": "old", "nodes": 1}, 0, SINFO, "", "--partition old: the partition is down, not up"),
    ({}, 1, "", "slurm_load_partitions: Unable to contact slurm controller (connect failure)\n",
     "slurm: the controller does not answer on this machine (slurm_load_partitions: Unable to contact slurm controller "
     "(connect failure)); is slurmctld running?"),
    ({}, 0, "big 2 up\n", "", "slurm: no default partition; give --partition (big)"),
])
def test_partitions(kw, rc, out, err, answer):
    plan = _plan(**kw)
    if answer in ("rlbox", "big"):
        assert sp.judge_partitions(rc, out, err, plan) == answer
        return
    with pytest.raises(RlboxError) as e:
        sp.judge_partitions(rc, out, err, plan)
    assert str(e.value) == answer


@pytest.mark.parametrize("kw, rc, out, err, answer", [
    ({}, 0, "42\n", "", "42"),
    ({}, 0, "42;cluster\n", "", "42"),
    ({"partition": "nope"}, 1, "", "sbatch: error: invalid partition specified: nope\n"
     "sbatch: error: Batch job submission failed: Invalid partition name specified\n",
     "--partition nope: Slurm has no such partition (sbatch: error: Batch job submission failed: Invalid partition name specified)"),
    ({"npus": 17}, 1, "", "sbatch: error: Batch job submission failed: Requested node configuration is not available\n",
     "--nodes 2 with npu:17 each: the cluster cannot give that (sbatch: error: Batch job submission failed: Requested node "
     "configuration is not available)"),
    ({}, 1, "", "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n",
     "slurm: the controller does not answer on this machine (sbatch: error: Batch job submission failed: Unable to contact "
     "slurm controller (connect failure)); is slurmctld running?"),
    ({}, 1, "", "sbatch: error: something new\n", "slurm: sbatch refused the job: sbatch: error: something new"),
])
def test_sbatch_answers(kw, rc, out, err, answer):
    plan = _plan(**kw)
    if answer.isdigit():
        assert sp.judge_sbatch(rc, out, err, plan) == answer
        return
    with pytest.raises(RlboxError) as e:
        sp.judge_sbatch(rc, out, err, plan)
    assert str(e.value) == answer


@pytest.mark.parametrize("line, answer", [
    ("RUNNING|None|h[1-2]", ("running", "h[1-2]")),
    ("PENDING|Resources|", ("waiting", None)),
    ("PENDING|Priority|", ("waiting", None)),
    ("CONFIGURING|None|h1", ("waiting", None)),
    ("PENDING|PartitionNodeLimit|", "--nodes 2: Slurm will never start job 7: more nodes than the partition allows (PartitionNodeLimit)"),
    ("PENDING|PartitionDown|", "--partition (the default): Slurm will never start job 7: the partition is down (PartitionDown)"),
    ("", "slurm: job 7 of run verl is gone from the queue (cancelled or ended)"),
    ("CANCELLED|None|", "slurm: job 7 of run verl is CANCELLED before it ran (None)"),
])
def test_queue_answers(line, answer):
    if isinstance(answer, tuple):
        assert sp.judge_queue(line, _plan(), "7") == answer
        return
    with pytest.raises(RlboxError) as e:
        sp.judge_queue(line, _plan(), "7")
    assert str(e.value) == answer


@pytest.mark.parametrize("state, completing_for, answer", [
    ("RUNNING\n", 0.0, None),
    ("TIMEOUT\n", 0.0, "slurm: job 7: Slurm's time limit (--time 1) ended the allocation; the run is torn down"),
    ("CANCELLED\n", 0.0, "slurm: job 7: the allocation was cancelled (scancel); the run is torn down"),
    ("NODE_FAIL\n", 0.0, "slurm: job 7: a node of the allocation failed; the run is torn down"),
    ("", 0.0, "slurm: job 7: the allocation is gone from the queue; the run is torn down"),
    # Slurm's time limit shows COMPLETING first, then TIMEOUT: the final state is waited for, a while
    ("COMPLETING\n", 0.0, None),
    ("COMPLETING\n", sp.COMPLETING_WAIT - 1, None),
    ("COMPLETING\n", sp.COMPLETING_WAIT, "slurm: job 7: the allocation is COMPLETING; the run is torn down"),
])
def test_allocation_end(state, completing_for, answer):
    assert sp.judge_ended(state, _plan(time="1"), "7", completing_for) == answer


@pytest.mark.parametrize("sinfo, answer", [
    ("h1 allocated\nh2 allocated\n", None),
    ("h1 allocated\nh2 down*\n", "slurm: node h2 is DOWN* (Slurm: not responding)"),
    ("h1 allocated*\nh2 allocated\n", "slurm: node h1 is ALLOCATED* (Slurm: not responding)"),
    ("h1 down\nh2 allocated\n", "slurm: node h1 is DOWN (Slurm: down)"),
    ("h1 draining\nh2 allocated\n", None),
    ("h3 down*\n", None),
])
def test_node_states(sinfo, answer):
    assert sp.judge_nodes(sinfo, ["h1", "h2"]) == answer


def test_nodes_map_to_hosts_by_address_then_name():
    hosts = ["10.0.0.1", "10.0.0.2", "n3"]
    assert sp.map_nodes(["h2", "n3"], {"h2": "10.0.0.2", "n3": "n3"}, hosts) == [1, 2]
    with pytest.raises(RlboxError) as e:
        sp.map_nodes(["h9"], {"h9": "10.0.0.9"}, hosts)
    assert str(e.value) == "slurm: node h9 (NodeAddr 10.0.0.9) is in no host of the cluster file (10.0.0.1, 10.0.0.2, n3)"


@pytest.mark.parametrize("rc, out, err, line", [
    (0, "RUNNING|h[1-2]|1:02|10:00\n", "", "slurm: job 7: RUNNING on h[1-2], 1:02 of 10:00"),
    (0, "PENDING||0:00|10:00\n", "", "slurm: job 7: PENDING on (no nodes yet), 0:00 of 10:00"),
    (0, "TIMEOUT|h[1-2]|10:00|10:00\n", "", "slurm: job 7: TIMEOUT on h[1-2], 10:00 of 10:00"),
    (0, "", "", "slurm: job 7: no longer in Slurm's queue (the allocation ended)"),
    (1, "", "slurm_load_jobs error: Invalid job id specified\n", "slurm: job 7: no longer in Slurm's queue (the allocation ended)"),
    (1, "", "squeue: error: Unable to contact slurm controller (connect failure)\n",
     "slurm: job 7: Slurm did not answer (squeue: error: Unable to contact slurm controller (connect failure))"),
])
def test_status_answers(rc, out, err, line):
    assert sp.status_line(sp.judge_status(rc, out, err, "7")) == line


@pytest.mark.parametrize("record, why", [
    ("{not json", "not a readable allocation record"),
    ('{"job": "7; rm -rf /"}', "field job must be a Slurm job id"),
    ('{"job": 7}', "field job must be a Slurm job id"),
    ('["7"]', "field job must be a Slurm job id"),
    ('{"job": "7", "login": ["h1"]}', "field job must be a Slurm job id and login a host name"),
])
def test_a_tampered_allocation_record_is_one_line(tmp_path, record, why):
    from rlbox.backends.slurm.backend import BACKEND
    from rlbox.core.errors import RlboxError

    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "slurm.json").write_text(record)
    for call in (BACKEND.status, lambda d, n: BACKEND.stop(d, n, None)):
        with pytest.raises(RlboxError, match=why):
            call(tmp_path, "r")


SHOW_JOB = """JobId=7 JobName=rlbox-sl-g
   JobState=RUNNING Reason=None Dependency=(null)
   NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   JOB_GRES=npu:8
     Nodes=h[1-2] CPU_IDs=1 Mem=0 GRES=npu:4(IDX:4-7)
   TresPerNode=gres:npu:4
"""


@pytest.mark.parametrize("text, npus, found, why", [
    (SHOW_JOB, 4, [("h[1-2]", (4, 5, 6, 7))], None),
    ("     Nodes=h1 CPU_IDs=0 Mem=0 GRES=npu:4(IDX:0-1,6-7)\n     Nodes=h3 CPU_IDs=0 Mem=0 GRES=npu:4(IDX:0-3)\n", 4,
     [("h1", (0, 1, 6, 7)), ("h3", (0, 1, 2, 3))], None),
    ("     Nodes=h1 CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1),npu:ascend:2(IDX:2-3)\n", 2, [("h1", (2, 3))], None),
    ("     Nodes=h1 CPU_IDs=0 Mem=0 GRES=\n", 4, [], "slurm: job 7: no npu ids in its allocation on h1 (no GRES)"),
    ("     Nodes=h1 CPU_IDs=0 Mem=0 GRES=npu:2(IDX:0-1)\n", 4, [], "slurm: job 7: 2 npu ids on h1, not the 4 asked"),
    ("JobId=7\n   JobState=RUNNING\n", 4, [], "slurm: job 7: scontrol shows no node of its allocation"),
])
def test_the_npu_ids_slurm_allocated_are_read_never_guessed(text, npus, found, why):
    assert sp.judge_gres(text, npus, "7") == (found, why)


@pytest.mark.parametrize("ids, text", [((0, 1, 2, 3), "0-3"), ((4, 5, 6, 7, 9), "4-7,9"), ((2,), "2"), ((), "")])
def test_ids_are_said_as_slurm_writes_them(ids, text):
    assert sp.ids_text(ids) == text
    assert sp.parse_ids(text) == ids if text else True


def test_a_run_slurm_ended_still_names_a_node_its_teardown_could_not_reach():
    from rlbox.backends.slurm.backend import ended_line

    from rlbox.cluster.ending import Ending, last_line

    ended = "Slurm ended allocation 7 (TIMEOUT)"
    assert ended_line(ended, "r", Ending("run 'r' failed: x").completed(True)) == \
        f"{ended} (run 'r': every node was cleaned up)"
    gone = RlboxError("h2: cannot list run r's containers (its engine has not answered for 10 s); rerun `rlbox stop --name r`")
    assert ended_line(ended, "r", last_line(Ending("run 'r' failed: x"), gone)) == \
        f"{ended} (run 'r': the other nodes were cleaned up); then {gone}"
    assert ended_line(ended, "r", last_line(RlboxError("run 'r': Ray not ready"), gone)) == f"{ended} (run 'r'); then {gone}"
    assert ended_line(ended, "r", RlboxError("run 'r': Ray not ready")) == f"{ended} (run 'r')"  # says nothing it was not told

