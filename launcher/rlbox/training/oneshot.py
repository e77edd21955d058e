"""One command in a container of an image, once: created, started, its output streamed, its
exit code returned, and the container removed whatever happens (failure, Ctrl-C, SIGTERM).

`rlbox data prepare`, `rlbox merge` and the checkpoint gathering run their work this way: inside
the training image, on the node whose disk holds the files, never through a shell built from
user input (the command is an argv list; scripts travel as ``python3 -c SOURCE ARGS...``).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from rlbox.cluster.spec import Mount
from rlbox.core import engine
from rlbox.core.errors import RlboxError
from rlbox.cluster.plan import LABEL_MANAGED

LABEL_TASK = "io.rlbox.task"


@dataclass(frozen=True)
class OneShot:
    """A container that runs one command and is removed afterwards, as data."""

    name: str
    image: str
    argv: tuple[str, ...]
    mounts: tuple[Mount, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    task: str = "task"
    network: str = "host"
    workdir: str | None = None
    user: str | None = None
    labels: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def all_labels(self) -> dict[str, str]:
        return {LABEL_MANAGED: "true", LABEL_TASK: self.task, **dict(self.labels)}

    def as_dict(self) -> dict:
        return {"name": self.name, "image": self.image, "argv": list(self.argv), "mounts": [m.spec() for m in self.mounts],
                "env": dict(self.env), "network": self.network, "workdir": self.workdir, "user": self.user,
                "labels": self.all_labels()}

    def docker_run(self, show_argv: tuple[str, ...] | None = None) -> str:
        """The equivalent `docker run` (what --dry-run prints); ``show_argv`` replaces a long
        inline script by something readable."""
        argv = ["docker", "run", "--rm", "--name", self.name, "--network", self.network]
        if self.workdir:
            argv += ["--workdir", self.workdir]
        if self.user:
            argv += ["--user", self.user]
        for m in self.mounts:
            argv += ["--volume", m.spec()]
        for k, v in self.env:
            argv += ["--env", f"{k}={v}"]
        for k, v in self.all_labels().items():
            argv += ["--label", f"{k}={v}"]
        return shlex.join(argv + [self.image, *(show_argv or self.argv)])

    def docker_py(self) -> dict:
        from docker.types import Mount as DockerMount

        kwargs = {
            "image": self.image,
            "command": list(self.argv),
            "name": self.name,
            "detach": True,
            "labels": self.all_labels(),
            "environment": dict(self.env),
            "mounts": [DockerMount(m.target, m.source, type="bind", read_only=m.read_only) for m in self.mounts],
            "network_mode": self.network,
        }
        if self.workdir:
            kwargs["working_dir"] = self.workdir
        if self.user:
            kwargs["user"] = self.user
        return kwargs


@dataclass
class Result:
    exit_code: int
    output: str

    @property
    def last_line(self) -> str:
        lines = [line for line in self.output.strip().splitlines() if line.strip()]
        return lines[-1].strip() if lines else "no output"


def ensure_image(client, image: str, where: str) -> None:
    from docker.errors import ImageNotFound

    try:
        client.images.get(image)
    except ImageNotFound:
        raise RlboxError(f"{where}: image {image} is not present; pull it (docker pull) or build it (rlbox build)") from None


def run(client, job: OneShot, *, where: str = "local", emit: Callable[[str], None] | None = None) -> Result:
    """Run ``job`` on the engine ``client`` reaches; stream its output to ``emit`` line by line.
    The container is removed on every path out of here."""
    ensure_image(client, job.image, where)
    box = None
    chunks: list[str] = []
    with engine.sigterm_as_interrupt():
        try:
            try:
                engine.remove_stale(client, job.name)
                box = client.containers.create(**job.docker_py())
                box.start()
            except RlboxError:
                raise
            except Exception as err:  # noqa: BLE001 - docker.errors.APIError and friends
                raise RlboxError(f"{where}: cannot start {job.name}: {engine.reason(err)}") from None
            pending = ""
            for raw in box.logs(stream=True, follow=True):
                text = raw.decode(errors="replace")
                chunks.append(text)
                if emit:
                    pending += text
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        emit(line)
            if emit and pending:
                emit(pending)
            status = box.wait()
            return Result(int(status.get("StatusCode", 1)), "".join(chunks))
        except KeyboardInterrupt:
            raise RlboxError(f"interrupted; container {job.name} removed", exit_code=130) from None
        finally:
            if box is not None:
                engine.remove_quietly(box)
