"""`rlbox serve MODEL`: vLLM's OpenAI server in a container on one node's NPUs, until --stop.

The container is planned like a training node's (plan.ContainerSpec: the NPU devices, the
driver files, host network, `--ipc host`, raised limits) and runs
``python3 -m vllm.entrypoints.openai.api_server`` with seed 000 section 3.3.1's parameters as
defaults. rlbox waits until /health and /v1/models answer, then prints the endpoint and records
it (runs/serve/NAME.json) for `rlbox eval`.

SIMULATED with --sim: the container is a simulated node's (devices from /dev/null, stand-in
driver files and npu-smi, sim.py) on the local engine, its port published on 127.0.0.1, and it
runs rlbox's stub OpenAI server (scripts/stub_server.py, standard library) with the very same argv in
place of vLLM: no model is loaded and the answers are canned.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import requests
from pydantic import BaseModel, ConfigDict, Field

from rlbox.cluster import launch
from rlbox.cluster.hosts import connect, count_devices
from rlbox.cluster.sim import write_stand_ins
from rlbox.cluster.spec import Host, HostName, Mount, SshUser, from_file, from_hosts
from rlbox.core import engine, names
from rlbox.core.config import Int32, Url, load_file, parse_env
from rlbox.core.errors import RlboxError
from rlbox.registry import reference
from rlbox.training.oneshot import ensure_image
from rlbox.cluster.plan import (BASE_ENV, CONTROL_DEVICES, DCMI_DIR, DRIVER_DIR, INSTALL_INFO, LABEL_MANAGED, NOFILE, NPROC,
                   NPU_SMI, SIM_DRIVER, ContainerSpec)

LABEL_SERVE = "io.rlbox.serve"
STUB = Path(__file__).resolve().parent / "scripts" / "stub_server.py"

# Seed 000, section 3.3.1 (vllm.entrypoints.openai.api_server for AISBench).
DEFAULTS = {
    "served_model_name": "auto",
    "gpu_memory_utilization": "0.9",
    "max_num_seqs": 24,
    "max_model_len": 22528,
    "tp": 8,
    "dp": 1,
    "port": 6380,
}


def vllm_args(model: str, *, tp: int, dp: int, max_model_len: int, port: int, served_model_name: str,
              memory_fraction: float | None = None) -> list[str]:
    """The server's arguments, as seed 000 passes them (max-num-batched-tokens = max-model-len)."""
    fraction = DEFAULTS["gpu_memory_utilization"] if memory_fraction is None else f"{memory_fraction:g}"
    return [
        f"--model={model}",
        "--served-model-name", served_model_name,
        "--gpu-memory-utilization", fraction,
        "--max-num-seqs", str(DEFAULTS["max_num_seqs"]),
        "--max-model-len", str(max_model_len),
        "--max-num-batched-tokens", str(max_model_len),
        "--enforce-eager",
        "--trust-remote-code",
        "--distributed_executor_backend=mp",
        "--tensor-parallel-size", str(tp),
        "--data-parallel-size", str(dp),
        "--generation-config", "vllm",
        "--port", str(port),
    ]


@dataclass(frozen=True)
class ServePlan:
    name: str
    host: Host
    model: str
    image: str
    sim: bool
    npus: int
    port: int
    max_model_len: int
    served_model_name: str
    tp: int
    dp: int
    container: ContainerSpec
    sim_files: str | None

    @property
    def url(self) -> str:
        """The endpoint as the operator reaches it."""
        if self.sim or self.host.local:
            return f"http://127.0.0.1:{self.port}"
        return f"http://{self.host.address or self.host.name}:{self.port}"

    def describe(self) -> str:
        import shlex

        what = "rlbox's stub OpenAI server (SIMULATED: no vLLM, no model loaded)" if self.sim else "vLLM's OpenAI server"
        argv = self.container.docker_run()
        if self.sim:  # the stub's source is long: show its name
            i = argv.index("-c")
            argv = argv[:i + 1] + [f"<{STUB.name}>"] + argv[i + 2:]
        return "\n".join([
            f"# rlbox serve {self.model} as '{self.served_model_name}' on {self.host.name}: {what}, "
            f"{self.npus} NPU(s) (TP {self.tp} x DP {self.dp}), max-model-len {self.max_model_len}",
            shlex.join(argv),
            f"# then wait for {self.url}/health and {self.url}/v1/models; endpoint {self.url}/v1",
        ]) + "\n"

    def as_dict(self) -> dict:
        return {"name": self.name, "host": self.host.name, "ssh_user": self.host.ssh_user, "ssh_port": self.host.ssh_port,
                "identity_file": self.host.identity_file, "known_hosts": self.host.known_hosts,
                "transport": "local" if self.host.local else "ssh", "container": self.container.name,
                "image": self.image, "model": self.model, "served_model_name": self.served_model_name,
                "url": self.url, "port": self.port, "max_model_len": self.max_model_len, "tp": self.tp, "dp": self.dp,
                "sim": self.sim}


def plan(*, name: str, model: str, host: Host, image: str, sim: bool, tp: int, dp: int, max_model_len: int, port: int,
         served_model_name: str, npus_available: int, hardware: str, runs_dir: Path, mounts: list[Mount],
         env: dict[str, str], nofile: int = NOFILE, memory_fraction: float | None = None) -> ServePlan:
    if tp < 1 or dp < 1:
        raise RlboxError("--tp and --dp must be 1 or more")
    if not 0 < port < 65536:
        raise RlboxError(f"--port {port}: out of range")
    if max_model_len < 1:
        raise RlboxError("--max-model-len must be positive")
    npus = tp * dp
    if npus > npus_available:
        raise RlboxError(f"--tp {tp} x --dp {dp} needs {npus} NPUs; {host.name} has {npus_available}")
    if not model.startswith("/"):
        raise RlboxError(f"MODEL {model}: give the absolute path of a Hugging Face model folder on {host.name}")
    argv = vllm_args(model, tp=tp, dp=dp, max_model_len=max_model_len, port=port, served_model_name=served_model_name,
                     memory_fraction=memory_fraction)
    sim_files = None
    devices = [(f"/dev/davinci{i}", f"/dev/davinci{i}") for i in range(npus)] + [(d, d) for d in CONTROL_DEVICES]
    driver = [Mount(DRIVER_DIR, DRIVER_DIR, True), Mount(DCMI_DIR, DCMI_DIR, True), Mount(NPU_SMI, NPU_SMI, True),
              Mount(INSTALL_INFO, INSTALL_INFO, True)]
    if sim:
        sim_files = str((runs_dir / "serve" / name / "sim").resolve())
        devices = [("/dev/null", dst) for _, dst in devices]
        driver = [Mount(f"{sim_files}/driver", DRIVER_DIR, True), Mount(f"{sim_files}/dcmi", DCMI_DIR, True),
                  Mount(f"{sim_files}/npu-smi", NPU_SMI, True), Mount(f"{sim_files}/ascend_install.info", INSTALL_INFO, True)]
        command = ("python3", "-c", STUB.read_text(encoding="utf-8"), *argv)
    else:
        command = ("python3", "-m", "vllm.entrypoints.openai.api_server", *argv)
    container = ContainerSpec(
        name=f"rlbox-serve-{name}",
        image=image,
        command=command,
        devices=tuple(devices),
        mounts=tuple(driver) + (Mount(model, model, True),) + tuple(mounts),
        env=tuple((BASE_ENV | {"RLBOX_SERVE": name} | env).items()),
        labels=((LABEL_MANAGED, "true"), (LABEL_SERVE, name)),
        network="bridge" if sim else "host",
        ulimits=(("nofile", nofile, nofile), ("nproc", NPROC, NPROC)),
        publish=(("127.0.0.1", port, port),) if sim else (),
    )
    return ServePlan(name, host, model, image, sim, npus, port, max_model_len, served_model_name, tp, dp, container,
                     sim_files)


def _answers(url: str) -> str | None:
    """None when /health and /v1/models both answer 200; else what is still missing."""
    try:
        if requests.get(f"{url}/health", timeout=3).status_code != 200:
            return "/health not 200"
        resp = requests.get(f"{url}/v1/models", timeout=3)
        if resp.status_code != 200 or not resp.json().get("data"):
            return "/v1/models lists no model"
    except (requests.RequestException, ValueError) as err:
        return type(err).__name__
    return None


def start(p: ServePlan, node, *, timeout: float, echo: Callable[[str], None], state_path: Path, hardware: str,
          driver: str) -> str:
    """Start the server and wait until it answers; on any failure remove its container."""
    client = node.client
    ensure_image(client, p.image, p.host.name)
    live = client.containers.list(all=True, ignore_removed=True, filters={"label": f"{LABEL_SERVE}={p.name}"})
    if live:
        raise RlboxError(f"a server named '{p.name}' is already there ({live[0].name}, {live[0].status}); "
                         f"stop it with `rlbox serve --stop --name {p.name}` or pick another --name")
    if p.sim_files:
        write_stand_ins(Path(p.sim_files), hardware, p.npus, driver)
    box = None
    done = False
    with engine.sigterm_as_interrupt():
        try:
            try:
                box = client.containers.create(**p.container.docker_py())
                box.start()
            except Exception as err:  # noqa: BLE001 - docker.errors.APIError and friends
                raise RlboxError(f"{p.host.name}: cannot start {p.container.name}: {engine.reason(err)}") from None
            url = p.url if (p.sim or p.host.local) else node.forward("127.0.0.1", p.port)
            echo(f"{p.container.name} started on {p.host.name}; waiting for {p.url}/health and /v1/models (up to {timeout:.0f} s)")
            deadline = time.monotonic() + timeout
            missing = None
            while time.monotonic() < deadline:
                box.reload()
                if box.status in ("exited", "dead"):
                    raise RlboxError(f"server container {p.container.name} exited ({box.attrs['State'].get('ExitCode')}) "
                                     f"before answering: {_last_line(box)}")
                missing = _answers(url)
                if missing is None:
                    state_path.parent.mkdir(parents=True, exist_ok=True)
                    state_path.write_text(json.dumps(p.as_dict() | {"started": time.time()}, indent=2))
                    done = True
                    return f"{p.url}/v1"
                time.sleep(0.5)
            raise RlboxError(f"server container {p.container.name} not healthy after {timeout:.0f} s ({missing}): {_last_line(box)}")
        except KeyboardInterrupt:
            raise RlboxError(f"interrupted; {p.container.name} removed", exit_code=130) from None
        finally:
            if box is not None and not done:
                keep_log(box, state_path.with_suffix(".log"))
                engine.remove_quietly(box)


def _last_line(box) -> str:
    try:
        lines = [line for line in box.logs(tail=20).decode(errors="replace").splitlines() if line.strip()]
    except Exception:  # noqa: BLE001
        return "no log"
    return f"last log line: {lines[-1].strip()}" if lines else "no output"


def keep_log(box, path: Path | None) -> Path | None:
    """The server container's whole log (vLLM's own lines) written to ``path`` before it goes."""
    if path is None:
        return None
    try:
        text = box.logs(stdout=True, stderr=True).decode(errors="replace")
    except Exception:  # noqa: BLE001 - a container already gone has no log to keep
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def stop(client, name: str, log: Path | None = None) -> int:
    boxes = client.containers.list(all=True, ignore_removed=True, filters={"label": f"{LABEL_SERVE}={name}"})
    for box in boxes:
        keep_log(box, log)
        engine.remove_quietly(box)
    return len(boxes)


def host_of(state: dict) -> Host:
    return Host.from_record(state)


def state_path(runs_dir: Path, name: str) -> Path:
    """The record of server NAME (what `rlbox eval` and `rlbox serve --stop` read); NAME is a run
    name (it names a container too) and the record stays under RUNS_DIR/serve/."""
    return names.inside(runs_dir / "serve", f"{names.check(name, '--name')}.json", what="--name")


class ServeRecord(BaseModel):
    """RUNS_DIR/serve/NAME.json as read back (ServePlan.as_dict)."""

    model_config = ConfigDict(extra="allow")
    name: names.RunName | None = None
    host: HostName | None = None
    image: reference.ImageRef | None = None
    ssh_user: SshUser | None = None
    ssh_port: int | None = Field(None, ge=1, le=65535)
    identity_file: str | None = None
    known_hosts: str | None = None
    transport: Literal["local", "ssh", "auto"] = "auto"
    url: Url | None = None
    port: int | None = Field(None, ge=1, le=65535)
    max_model_len: Int32 | None = Field(None, ge=1)


def load_record(path: Path, *fields: str) -> dict:
    """A server's record through ``ServeRecord``, with ``fields`` present; a broken one is one
    line naming the file and the field."""
    hint = "; not a server record: remove it, and any container it started (docker ps --filter label=io.rlbox.serve)"
    try:
        data = load_file(path, ServeRecord, str(path), fmt="json").model_dump(exclude_unset=True)
    except RlboxError as err:
        raise RlboxError(f"{err}{hint}") from None
    missing = [f for f in fields if not data.get(f)]
    if missing:
        raise RlboxError(f"{path}: {missing[0]}: missing{hint}")
    return data


def stop_named(runs_dir: Path, name: str) -> tuple[int, str, Path | None]:
    """`rlbox serve --stop`: keep server NAME's log (RUNS_DIR/serve/NAME.log), remove its container(s)
    on its host and its record; the number removed, the host and the log's path."""
    path = state_path(runs_dir, name)
    if not path.is_file():
        raise RlboxError(f"no server named '{name}' under {runs_dir} (rlbox serve MODEL --name {name} starts one)")
    state = load_record(path, "host")
    node = connect(host_of(state))
    log = path.with_suffix(".log")  # RUNS_DIR/serve/NAME.log, beside the record (start keeps it there too)
    try:
        removed = stop(node.client, name, log)
    finally:
        node.close()
    path.unlink()
    return removed, state["host"], (log if log.is_file() else None)


def plan_request(load_matrix, *, model: str | None, hosts: str | None, sim: bool, image: str | None, image_ref,
                 hardware: str, tp: int, dp: int, max_model_len: int, port: int, served_model_name: str, name: str,
                 runs_dir: Path, mounts: list[str], envs: list[str], dry_run: bool, cluster: Path | None = None,
                 node: int = 0, memory_fraction: float | None = None) -> ServePlan:
    """`rlbox serve MODEL` options to a plan: the one host (this machine unless --hosts), the
    image (RELEASE:VARIANT through ``image_ref``; the sim image for --sim), the NPUs it has.
    ``load_matrix`` reads images/ only once the options are known to be consistent."""
    if not model:
        raise RlboxError("serve: give MODEL (a Hugging Face model folder), or --stop")
    if sum(bool(x) for x in (hosts, sim, cluster)) > 1:
        raise RlboxError("give one of --hosts, --cluster or --sim")
    local = Host(name="localhost", transport="local")
    nofile = None  # the cluster file's open-files limit for its nodes' containers, as `rlbox run` takes it
    if cluster is not None:
        spec = from_file(cluster)
        every, nofile = spec.hosts, spec.nofile
        if node >= len(every):
            raise RlboxError(f"--node {node}: {cluster} has {len(every)} node(s) (0..{len(every) - 1})")
        host_list = (every[node],)
    else:
        host_list = from_hosts(hosts).hosts if hosts else (local,)
    if len(host_list) != 1:
        raise RlboxError(f"--hosts {hosts}: serve runs on one host")
    host = host_list[0]
    m = load_matrix()
    if sim:
        image_name, _ = m.image_for(image or f"rlbox_sim:{launch.host_arch_variant()}")
        npus = m.hardware[hardware].npus_per_node
    else:
        image_name = image_ref(image, "serve")
        npus = count_devices(host) if not dry_run else tp * dp
        if npus == 0:
            raise RlboxError(f"{host.name}: no /dev/davinci* devices; is the Ascend driver installed? (--sim rehearses without NPUs)")
    return plan(name=name, model=str(Path(model).expanduser().resolve()) if host.local or sim else model,
                host=host, image=image_name, sim=sim, tp=tp, dp=dp, max_model_len=max_model_len, port=port,
                served_model_name=served_model_name, npus_available=npus, hardware=hardware, runs_dir=runs_dir,
                mounts=[Mount.parse(x) for x in mounts], env=parse_env(envs),
                nofile=launch.nofile_for(host if not sim else local, nofile), memory_fraction=memory_fraction)


def serve(p: ServePlan, *, timeout: float, echo: Callable[[str], None], runs_dir: Path, hardware: str) -> str:
    """Carry out the plan on its host: the server started, answering, recorded; its endpoint."""
    if (p.host.local or p.sim) and not Path(p.model).is_dir():
        raise RlboxError(f"MODEL {p.model} is not a folder")
    node = connect(p.host)
    try:
        return start(p, node, timeout=timeout, echo=echo, state_path=state_path(runs_dir, p.name), hardware=hardware,
                     driver=SIM_DRIVER)
    finally:
        node.close()
