"""Issue 36 on testbed hosts (production path, over ssh): the NPU probe names a host whose job-visible
NPUs differ from its plan before the job starts; `rlbox doctor` names a down NPU link and an
unreachable peer NPU (the hosts' hccn_tool stand-in, told to fail) with host and device."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.testbed import rlbox

pytestmark = pytest.mark.engine

FAULTS = "/etc/rlbox-hccn-standin.faults"  # what the stand-in reads (rlbox.cluster.sim.HCCN_TOOL)


@pytest.fixture(scope="module")
def bed(testbed, sim_image):
    if testbed.image != sim_image:
        testbed.deliver(sim_image)
    return testbed


def test_a_host_whose_workers_see_other_npus_is_named_before_the_job_starts(bed, tmp_path):
    text = Path(bed.cluster(1, 2, path=tmp_path / "c.yaml")).read_text()
    wrong = f"  - host: {bed.address(2)}\n    env: {{RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES: '1', ASCEND_RT_VISIBLE_DEVICES: '1,0,2,3'}}"
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(f"  - host: {bed.address(2)}", wrong))
    proc = rlbox("run", "--cluster", str(bad), "--image", "rlbox_sim:amd64", "--devices", "4", "--name", "tbt-probe",
                 "--runs-dir", str(tmp_path), "--", "python3", "-c", "print('THE-JOB-RAN')", timeout=600)
    err = proc.stderr
    assert proc.returncode != 0 and "Traceback" not in err, err[-3000:]
    assert "cluster ready: 2 nodes" in err and "THE-JOB-RAN" not in proc.stdout + err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("rlbox: error: npu probe: node1 (") and bed.address(2) in last, last
    assert "ASCEND_RT_VISIBLE_DEVICES=1,0,2,3" in last and "not in ascending order" in last, last
    assert "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES=1 is set, against the release's policy" in err
    assert "node0 (" not in "\n".join(line for line in err.splitlines() if "npu probe" in line)
    for i in (1, 2):  # torn down: nothing of the run on either host
        assert bed.leftovers_prefix("tbt-probe", i) == []


def test_doctor_names_a_down_npu_link_and_an_unreachable_peer_npu(bed, tmp_path):
    cluster = bed.cluster(1, 2, path=tmp_path / "c.yaml")
    try:
        assert bed.ssh(2, f"printf 'link 3 DOWN\\nunreachable 192.168.105.1\\n' > {FAULTS}").returncode == 0
        proc = rlbox("doctor", "--cluster", cluster, "--name", "tbt-npunet", "--json", timeout=300)
    finally:
        bed.ssh(2, "rm", "-f", FAULTS)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    import json
    bad = {(c["node"], c["name"]): c for c in json.loads(proc.stdout)["checks"] if not c["ok"]}
    h2 = f"node1 ({bed.address(2)})"
    assert set(bad) == {(h2, "npu link"), (h2, "npu ping")}, bad
    assert bad[(h2, "npu link")]["detail"] == "device 3 DOWN" and "hccn_tool -i 3 -link -g" in bad[(h2, "npu link")]["fix"]
    ping = bad[(h2, "npu ping")]["detail"]
    assert f"device 3 -> node0 ({bed.address(1)}) device 3 192.168.103.1" in ping  # its own link is down
    assert f"device 5 -> node0 ({bed.address(1)}) device 5 192.168.105.1: 0/3 received" in ping
