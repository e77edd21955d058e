"""The testbed tests' shared hosts: one 4-host A3 testbed per session (the sim image loaded into
every host), taken down at the end, which must leave nothing. Tests that need two hosts use a
cluster file of two of them (``bed.cluster(1, 2)``)."""

from __future__ import annotations

import pytest

from support.testbed import Testbed

SESSION_NAME = "tbt"
SESSION_SUBNET = "10.201.1.0/24"


@pytest.fixture(scope="session")
def bed(sim_image):
    testbed = Testbed.up(hosts=4, hardware="a3", name=SESSION_NAME, image=sim_image,
                         extra=("--subnet", SESSION_SUBNET))
    yield testbed
    proc = testbed.down()
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture
def clean(bed):
    """After the test: no container of a tbt- run on any host."""
    yield bed
    left = [line for h in bed.hosts for line in bed.leftovers_prefix("tbt-", h["index"])]
    bed.remove_runs("tbt-")
    assert left == [], left
