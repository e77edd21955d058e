"""`rlbox merge RUN --step N`: verl's FSDP actor shards of one step into a Hugging Face model.

Where the shards are: verl's trainer saves to ``trainer.default_local_dir`` (default
``checkpoints/${trainer.project_name}/${trainer.experiment_name}``, project ``verl_examples``,
experiment ``gsm8k``), step N in ``global_step_N/actor``: every rank writes
``model_world_size_W_rank_R.pt`` on its own node's disk; rank 0 adds ``fsdp_config.json`` and
``huggingface/`` (config, tokenizer). The run's recorded job (runs/RUN/state.json) gives those
overrides, and its nodes' recorded mounts map the container path to each node's host path.

Then, through each node's engine connection (hosts.py): list the step on every node (a short
container of the run's image with the checkpoint folder mounted read-only), check all W ranks
are there, stream the shards held elsewhere onto the node holding rank 0 (docker get_archive
from a container on the source node, put_archive into one on the target node; never started),
and run verl's own ``python -m verl.model_merger merge --backend fsdp`` there, in the image.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from rlbox.cluster.spec import Host, Mount
from rlbox.core import engine
from rlbox.core.errors import RlboxError
from rlbox.training.oneshot import OneShot

SHARD = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
VERL_DEFAULTS = {"trainer.project_name": "verl_examples", "trainer.experiment_name": "gsm8k",
                 "trainer.default_local_dir": "checkpoints/${trainer.project_name}/${trainer.experiment_name}"}

# Runs in the image on one node: what the checkpoint folder holds (one JSON line).
LIST_SCRIPT = r"""
import json, os, re, sys
root, step = sys.argv[1], sys.argv[2]
actor = os.path.join(root, f"global_step_{step}", "actor")
out = {"steps": sorted(int(d[12:]) for d in os.listdir(root) if re.fullmatch(r"global_step_\d+", d)),
       "shards": [], "fsdp_config": None, "huggingface": False}
if os.path.isdir(actor):
    for name in sorted(os.listdir(actor)):
        if re.fullmatch(r"model_world_size_\d+_rank_\d+\.pt", name):
            out["shards"].append([name, os.path.getsize(os.path.join(actor, name))])
    cfg = os.path.join(actor, "fsdp_config.json")
    if os.path.isfile(cfg):
        out["fsdp_config"] = json.load(open(cfg))
    out["huggingface"] = os.path.isfile(os.path.join(actor, "huggingface", "config.json"))
print("rlbox-merge-list: " + json.dumps(out))
"""


@dataclass(frozen=True)
class NodeRef:
    index: int
    host: Host
    mounts: tuple[Mount, ...]

    @property
    def label(self) -> str:
        return f"node{self.index} ({self.host.name})"


@dataclass(frozen=True)
class Location:
    """The run's checkpoint folder: as the containers saw it, and per node on the host."""

    container_path: str
    origin: str  # how it was found
    host_paths: tuple[str, ...]  # per node, same order as the run's nodes


def overrides(entrypoint: str) -> tuple[str | None, dict[str, str]]:
    """The job's working dir (``cd X && ...``) and its Hydra ``key=value`` overrides."""
    try:
        words = shlex.split(entrypoint)
    except ValueError:
        words = entrypoint.split()
    workdir = None
    if len(words) >= 3 and words[0] == "cd" and words[2] == "&&":
        workdir, words = words[1], words[3:]
    found = {}
    for w in words:
        key, sep, value = w.lstrip("+").partition("=")
        if sep and re.fullmatch(r"[A-Za-z_][\w.]*", key):
            found[key] = value
    return workdir, found


def _interpolate(value: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{([\w.]+)\}", lambda m: values.get(m.group(1), m.group(0)), value)


def checkpoint_dir(job_entrypoint: str) -> tuple[str, str]:
    """The container path verl saved checkpoints to, and which override (or default) said so."""
    workdir, given = overrides(job_entrypoint)
    values = VERL_DEFAULTS | {k: v for k, v in given.items() if k in VERL_DEFAULTS}
    path = _interpolate(values["trainer.default_local_dir"], values)
    origin = ("trainer.default_local_dir=" + given["trainer.default_local_dir"] if "trainer.default_local_dir" in given
              else f"verl's default checkpoints/{{project}}/{{experiment}} = {path}")
    if not path.startswith("/"):
        if not workdir:
            raise RlboxError(f"the job saved checkpoints to the relative path {path} inside its containers (from {origin}), "
                             "which are gone; set trainer.default_local_dir to a mounted absolute path, "
                             "or pass --checkpoint-dir HOST_DIR")
        path = str(PurePosixPath(workdir) / path)
    return path, origin


def host_path(container_path: str, mounts: tuple[Mount, ...]) -> str | None:
    """Where a container path lives on the node's host: through the deepest mount holding it."""
    best = None
    for m in mounts:
        t = m.target.rstrip("/") or "/"
        if container_path == t or container_path.startswith(t.rstrip("/") + "/"):
            if best is None or len(t) > len(best.target.rstrip("/")):
                best = m
    if best is None:
        return None
    rest = container_path[len(best.target.rstrip("/")):]
    return best.source.rstrip("/") + rest


def mounts_of(docker_run: list[str]) -> tuple[Mount, ...]:
    """The bind mounts of a recorded `docker run` argv."""
    found = []
    for flag, value in zip(docker_run, docker_run[1:]):
        if flag == "--volume":
            found.append(Mount.parse(value, "state.json"))
    return tuple(found)


def nodes_of(state: dict) -> list[NodeRef]:
    refs = []
    for n in state["nodes"]:
        host = Host(name=n["host"], ssh_user=n.get("ssh_user"), ssh_port=n.get("ssh_port"),
                    identity_file=n.get("identity_file"), known_hosts=n.get("known_hosts"),
                    transport=n.get("transport", "auto"))
        refs.append(NodeRef(n["index"], host, mounts_of(n.get("docker_run") or [])))
    return refs


def locate(state: dict, run: str, checkpoint_dir_override: str | None) -> Location:
    nodes = nodes_of(state)
    if checkpoint_dir_override:
        path = checkpoint_dir_override.rstrip("/") or "/"
        return Location(path, "--checkpoint-dir", tuple(path for _ in nodes))
    job = state.get("job") or {}
    if not job.get("entrypoint"):
        raise RlboxError(f"run '{run}' recorded no job; pass --checkpoint-dir HOST_DIR")
    path, origin = checkpoint_dir(job["entrypoint"])
    hosts = []
    for n in nodes:
        hp = host_path(path, n.mounts)
        if hp is None:
            raise RlboxError(f"run '{run}' saved checkpoints to {path} ({origin}), which is on no mount of {n.label}: "
                             "they were lost with its container; mount a host folder there (--mount) next time, "
                             "or pass --checkpoint-dir HOST_DIR")
        hosts.append(hp)
    return Location(path, origin, tuple(hosts))


# ---------------------------------------------------------------------------------------------
@dataclass
class Listing:
    node: NodeRef
    root: str
    steps: list[int] = field(default_factory=list)
    shards: dict[int, tuple[str, int]] = field(default_factory=dict)  # rank -> (name, size)
    world: set[int] = field(default_factory=set)
    fsdp_world: int | None = None
    huggingface: bool = False


def parse_listing(node: NodeRef, root: str, payload: dict) -> Listing:
    lst = Listing(node, root, steps=list(payload.get("steps", [])), huggingface=bool(payload.get("huggingface")))
    for name, size in payload.get("shards", []):
        m = SHARD.match(name)
        if m:
            lst.world.add(int(m.group(1)))
            lst.shards[int(m.group(2))] = (name, int(size))
    cfg = payload.get("fsdp_config") or {}
    if isinstance(cfg.get("world_size"), int):
        lst.fsdp_world = cfg["world_size"]
    return lst


@dataclass(frozen=True)
class Holdings:
    world: int
    owner: dict[int, int]  # rank -> index into the listings
    merge_at: int  # listing index of the node with rank 0 and huggingface/


def check(listings: list[Listing], step: int, location: Location) -> Holdings:
    """Every rank 0..W-1 held by some node, W agreed by every file and fsdp_config.json."""
    actor = f"global_step_{step}/actor"
    if not any(lst.shards for lst in listings):
        steps = sorted({s for lst in listings for s in lst.steps})
        where = ", ".join(f"{lst.node.label} {lst.root}" for lst in listings)
        have = f"steps saved: {', '.join(map(str, steps))}" if steps else "no global_step_* there at all"
        raise RlboxError(f"no FSDP shards of step {step} ({actor}) on any node; looked at {where}; {have}")
    worlds = set().union(*(lst.world for lst in listings)) | {lst.fsdp_world for lst in listings if lst.fsdp_world}
    if len(worlds) != 1:
        raise RlboxError(f"{actor}: shards of different world sizes ({', '.join(map(str, sorted(worlds)))}) on the nodes; "
                         "remove the stale ones")
    world = worlds.pop()
    owner: dict[int, int] = {}
    for i, lst in enumerate(listings):
        for rank in lst.shards:
            owner.setdefault(rank, i)
    missing = [r for r in range(world) if r not in owner]
    if missing:
        per_node = max(1, world // len(listings))
        r = missing[0]
        expect = listings[min(r // per_node, len(listings) - 1)]
        more = f" ({len(missing)} ranks missing: {', '.join(map(str, missing[:8]))}{'...' if len(missing) > 8 else ''})" if len(missing) > 1 else ""
        raise RlboxError(f"{actor}: rank {r} of {world} is missing: model_world_size_{world}_rank_{r}.pt is on no node; "
                         f"it should be on {expect.node.label} in {expect.root}/{actor}{more}")
    head = owner[0]
    if not listings[head].huggingface or listings[head].fsdp_world is None:
        raise RlboxError(f"{actor} on {listings[head].node.label} (rank 0) has no huggingface/config.json or "
                         "fsdp_config.json: not a complete verl FSDP checkpoint")
    return Holdings(world, owner, head)


# ---------------------------------------------------------------------------------------------
@dataclass
class MergePlan:
    run: str
    step: int
    image: str
    location: Location
    nodes: list[NodeRef]
    target: str | None

    def actor(self, i: int) -> str:
        return f"{self.location.host_paths[i]}/global_step_{self.step}/actor"

    def target_for(self, i: int) -> str:
        return self.target or f"{self.location.host_paths[i]}/global_step_{self.step}/hf_merged"

    def merge_argv(self, i: int) -> list[str]:
        return ["python3", "-m", "verl.model_merger", "merge", "--backend", "fsdp",
                "--local_dir", self.actor(i), "--target_dir", self.target_for(i)]

    def describe(self) -> str:
        lines = [f"# rlbox merge {self.run} --step {self.step}: checkpoints at {self.location.container_path} "
                 f"({self.location.origin}), image {self.image}"]
        for n, hp in zip(self.nodes, self.location.host_paths):
            lines.append(f"#   {n.label}: {hp}/global_step_{self.step}/actor")
        lines.append("# 1. list every node's shards; all ranks 0..W-1 must be present")
        lines.append("# 2. stream the shards held elsewhere onto the node holding rank 0 (docker get_archive -> put_archive)")
        lines.append("# 3. on that node, inside the image (node0 shown):")
        lines.append(shlex.join(self.merge_argv(0)))
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict:
        return {"run": self.run, "step": self.step, "image": self.image, "target": self.target,
                "checkpoints": {"container_path": self.location.container_path, "origin": self.location.origin},
                "nodes": [{"index": n.index, "host": n.host.name, "actor": self.actor(i), "target": self.target_for(i)}
                          for i, n in enumerate(self.nodes)],
                "merge_argv": self.merge_argv(0)}


def plan(state: dict, *, run: str, step: int, image: str | None, target: str | None,
         checkpoint_dir_override: str | None) -> MergePlan:
    if step < 0:
        raise RlboxError("--step must be 0 or more")
    location = locate(state, run, checkpoint_dir_override)
    if target and not target.startswith("/"):
        raise RlboxError(f"--target {target}: give an absolute path (on the node holding rank 0)")
    return MergePlan(run, step, image or state["image"], location, nodes_of(state), target)


def _listing(p: MergePlan, i: int, node) -> Listing:
    from rlbox.training import oneshot

    ref, root = p.nodes[i], p.location.host_paths[i]
    job = OneShot(name=f"rlbox-merge-{p.run}-list{i}", image=p.image, task="merge", network="none",
                  argv=("python3", "-c", LIST_SCRIPT, root, str(p.step)), mounts=(Mount(root, root, True),))
    try:
        result = oneshot.run(node.client, job, where=ref.label)
    except RlboxError as err:
        if "bind source path does not exist" in str(err):
            return Listing(ref, root)  # no checkpoint folder on this node at all
        raise
    lines = [line for line in result.output.splitlines() if line.startswith("rlbox-merge-list: ")]
    if result.exit_code != 0 or not lines:
        raise RlboxError(f"{ref.label}: cannot list {root}: {result.last_line}")
    return parse_listing(ref, root, json.loads(lines[-1].removeprefix("rlbox-merge-list: ")))


def _holder(client, image: str, name: str, mount: Mount):
    """A created, never started container that gives the archive API a view of ``mount``."""
    from docker.types import Mount as DockerMount

    engine.remove_stale(client, name)
    return client.containers.create(image, ["true"], name=name, network_mode="none",
                                    labels={engine.LABEL_MANAGED: "true", "io.rlbox.task": "merge"},
                                    mounts=[DockerMount(mount.target, mount.source, type="bind", read_only=mount.read_only)])


def gather(p: MergePlan, nodes, listings: list[Listing], holdings: Holdings, echo: Callable[[str], None]) -> int:
    """Copy every shard held on another node into the merge node's actor folder."""
    dest_i = holdings.merge_at
    moves = sorted((rank, i) for rank, i in holdings.owner.items() if i != dest_i)
    if not moves:
        return 0
    dest_actor = p.actor(dest_i)
    sink = None
    sources = {}
    try:
        sink = _holder(nodes[dest_i].client, p.image, f"rlbox-merge-{p.run}-sink", Mount(dest_actor, "/sink"))
        for rank, i in moves:
            if i not in sources:
                sources[i] = _holder(nodes[i].client, p.image, f"rlbox-merge-{p.run}-src{i}", Mount(p.actor(i), "/src", True))
            name, size = listings[i].shards[rank]
            stream, _ = sources[i].get_archive(f"/src/{name}")
            if not sink.put_archive("/sink", stream):
                raise RlboxError(f"{p.nodes[dest_i].label}: could not write {name} into {dest_actor}")
            echo(f"gathered rank {rank} ({name}, {size / 1e6:.1f} MB) from {p.nodes[i].label} onto {p.nodes[dest_i].label}")
    except RlboxError:
        raise
    except Exception as err:  # noqa: BLE001 - docker errors: one line naming the step
        raise RlboxError(f"gathering shards onto {p.nodes[dest_i].label}: {engine.reason(err)}") from None
    finally:
        for box in [sink, *sources.values()]:
            if box is not None:
                engine.remove_quietly(box)
    return len(moves)


def execute(p: MergePlan, echo: Callable[[str], None], emit: Callable[[str], None]) -> str:
    """List, check, gather, merge. Returns the merged model's folder (on the merge node)."""
    from rlbox.training import oneshot
    from rlbox.cluster.hosts import connect_all, on_every

    nodes = connect_all(tuple(n.host for n in p.nodes))
    try:
        for i, (ref, node) in enumerate(zip(p.nodes, nodes)):
            oneshot.ensure_image(node.client, p.image, ref.label)
        listings, errors = on_every(lambda i: _listing(p, i, nodes[i]), list(range(len(nodes))))
        if errors:
            raise errors[0]
        holdings = check(listings, p.step, p.location)
        head = p.nodes[holdings.merge_at]
        echo(f"step {p.step}: {holdings.world} FSDP shard(s) on {sum(1 for lst in listings if lst.shards)} node(s); "
             f"merging on {head.label}")
        gather(p, nodes, listings, holdings, echo)
        target = p.target_for(holdings.merge_at)
        parent = str(PurePosixPath(target).parent)
        actor = p.actor(holdings.merge_at)
        job = OneShot(name=f"rlbox-merge-{p.run}", image=p.image, task="merge", network="none",
                      argv=tuple(p.merge_argv(holdings.merge_at)),
                      mounts=(Mount(actor, actor, True), Mount(parent, parent)))
        echo("$ " + shlex.join(job.argv))
        if head.host.local:
            from pathlib import Path

            Path(target).mkdir(parents=True, exist_ok=True)
        try:
            result = oneshot.run(nodes[holdings.merge_at].client, job, where=head.label, emit=emit)
        except RlboxError as err:
            if "bind source path does not exist" in str(err):
                raise RlboxError(f"{head.label}: {parent} does not exist there; create it or pick another --target") from None
            raise
        if result.exit_code != 0:
            raise RlboxError(f"verl's model_merger failed on {head.label} (exit {result.exit_code}): {result.last_line}",
                             exit_code=result.exit_code)
        return f"{head.label}:{target}"
    finally:
        for n in nodes:
            n.close()
