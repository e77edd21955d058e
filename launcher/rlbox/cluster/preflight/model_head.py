"""The model's small files from the head node of the run's cluster, over the run's ssh, for `rlbox
validate` (rlbox.verl.model_files plans what and from where; this is the head's source).

Two ssh sessions: a ``find`` listing of the folder (files under the size cap), then a ``tar`` of the
names the allow-list keeps. Each is an argv whose words are quoted one by one for the remote shell:
the path and names are data, never shell. ssh's own failure (exit 255: the host does not answer,
refuses the key) ends validation with one line naming the host; a folder that is not there is said,
and the next source is tried.
"""

from __future__ import annotations

import subprocess

from rlbox.cluster import spec as cluster
from rlbox.cluster.hosts import ssh_argv
from rlbox.core import quote
from rlbox.core.errors import RlboxError
from rlbox.verl import model_files
from rlbox.verl.model_files import Missing, Source

TIMEOUT = 120


def remote(host: cluster.Host, argv: list[str]) -> subprocess.CompletedProcess:
    """``argv`` on ``host`` over ssh; an ssh failure (not the command's) raises one line naming the host."""
    line = " ".join(quote.shell(a) for a in argv)
    try:
        proc = subprocess.run(ssh_argv(host, command=[line]), capture_output=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RlboxError(f"the model's files: {host.name} did not answer over ssh within {TIMEOUT} s") from None
    except FileNotFoundError:
        raise RlboxError("the model's files: no ssh client on this machine") from None
    if proc.returncode == 255:
        last = (proc.stderr.decode(errors="replace").strip().splitlines() or ["ssh failed"])[-1]
        raise RlboxError(f"the model's files: cannot reach {host.name} over ssh: {' '.join(last.split())[:200]}")
    return proc


def from_head(host: cluster.Host):
    """The head's source for ``model_files.fetcher``: ``(source, dest) -> names written``."""
    def run(source: Source, dest) -> list[str]:
        listing = remote(host, model_files.find_argv(source.path))
        names = model_files.names_of(listing.stdout.decode(errors="replace"))
        if not names:
            why = (listing.stderr.decode(errors="replace").strip().splitlines() or ["none of the model's config or "
                                                                                    "tokenizer files"])[-1]
            raise Missing(f"{source.label}: {' '.join(why.split())[:200]}")
        got = remote(host, model_files.tar_argv(source.path, names))
        if got.returncode != 0:
            why = (got.stderr.decode(errors="replace").strip().splitlines() or ["tar failed"])[-1]
            raise Missing(f"{source.label}: {' '.join(why.split())[:200]}")
        return model_files.extract(got.stdout, dest, names, source.label)
    return run


def fetcher(*, hosts: str | None, cluster_file, mounts: list[str], image: str | None, client_factory):
    """``fetch_model`` of `rlbox validate`: the head of the cluster given (``--hosts``/``--cluster``), the
    run's mounts (the cluster file's, its head's, ``--mount``), the image the checks run in, the hub."""
    head = None
    spec_mounts: tuple[cluster.Mount, ...] = ()
    if hosts or cluster_file:
        spec = cluster.from_hosts(hosts) if hosts else cluster.from_file(cluster_file)
        head = spec.hosts[0]
        spec_mounts = spec.mounts + head.mounts
    pairs = tuple((m.source, m.target) for m in (*spec_mounts, *(cluster.Mount.parse(m) for m in mounts)))
    remote_head = head if head is not None and not head.local else None
    return model_files.fetcher(head=remote_head.name if remote_head else None,
                               from_head=from_head(remote_head) if remote_head else None, mounts=pairs,
                               image=image, client_factory=client_factory, hub=model_files.hub_endpoint())
