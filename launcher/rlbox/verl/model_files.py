"""The model's small files, for verl's checks that read them, when the model is not on this machine.

verl builds some of its config dataclasses from the model's Hugging Face files before any worker starts
(0.9's ``HFModelConfig`` of a critic reads the config, generation config and tokenizer at the model
path): where that path is not on this machine, verl's check stops on it and validation is only
partly checked. Then only those small files are fetched (never weights: an allow-list of names, a
size cap per file and in all), from where the path is, into a temporary folder, and verl's checks run
again against that copy:

- the head node of the run's cluster, over the run's ssh, when the path is under one of the run's
  mounts (the path on the host is the mount's source; a folder of this machine under that mount is
  read here instead);
- the image, when the path is under none of the run's mounts (then it can only be in the image);
- the hub, when the path is a hub name (``namespace/name``) and the hub answers.

Planning (which files, from which source, names that stay inside the folder) is pure; the sources
are thin: a ``find`` listing and a ``tar`` of the chosen names (argv; over ssh each word quoted),
or two HTTP requests per file. One line per model path says where its files came from, or why none.
"""

from __future__ import annotations

import fnmatch
import io
import os
import posixpath
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlbox.core.errors import RlboxError

# What verl (transformers) reads of a model to build its config: the config, generation config,
# tokenizer and processor files, chat templates, and the Python of a trust_remote_code config/tokenizer
ALLOWED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
           "tokenizer*.json", "special_tokens_map.json", "added_tokens.json", "vocab*", "merges.txt", "*.tiktoken",
           "chat_template*", "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
           "configuration_*.py", "tokenization_*.py", "processing_*.py", "image_processing_*.py")
NEVER = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.h5", "*.msgpack", "*.onnx", "*.npz",
         "*.index.json", "*.pkl")
# per file: a tokenizer.json is kilobytes to tens of MB (Qwen2.5 7 MB, Gemma 3 33 MB); weights are never asked for
MAX_FILE = 64 << 20
MAX_TOTAL = 192 << 20
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_HUB = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
# the keys verl builds an HFModelConfig from (actor_rollout_ref.model.path, critic.model.tokenizer_path, ...)
MODEL_KEY = re.compile(r"(?:^|\.)model\.(?:path|tokenizer_path|hf_config_path)$")


class Missing(RlboxError):
    """This source does not have the files (or cannot be asked): the next source is tried."""


def safe_name(name: str) -> bool:
    """A plain file name inside the folder: no folder part, no ``..``, nothing a shell or tar reads as more."""
    return bool(_SAFE.fullmatch(name)) and name not in (".", "..") and ".." not in name


def wanted(names) -> list[str]:
    """The names of the small files verl reads, sorted: allowed, never weights, safe as file names."""
    return sorted({n for n in names if safe_name(n) and not any(fnmatch.fnmatchcase(n, p) for p in NEVER)
                   and any(fnmatch.fnmatchcase(n, p) for p in ALLOWED)})


def is_hub_name(path: str) -> bool:
    return bool(_HUB.fullmatch(path)) and ".." not in path


def model_paths(keys, get) -> dict[str, str]:
    """{key: model path} of the composed config: the keys verl builds a model config from, resolved (``get``)."""
    out = {}
    for key in keys:
        if MODEL_KEY.search(key):
            value = get(key)
            if isinstance(value, str) and value.strip():
                out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# The plan: which source for which path.

@dataclass(frozen=True)
class Source:
    kind: str  # here | host | image | hub
    where: str  # this machine, the head's name, the image, the hub's URL
    path: str  # the folder at that source (a host path, a path in the image, a hub repo id)

    @property
    def label(self) -> str:
        return {"here": f"this machine ({self.path})", "host": f"{self.where}:{self.path} over ssh",
                "image": f"the image {self.where} ({self.path})", "hub": f"the hub {self.where} ({self.path})"}[self.kind]


@dataclass(frozen=True)
class Want:
    path: str  # the model path as the job gives it
    keys: tuple[str, ...]
    sources: tuple[Source, ...]  # tried in order
    why_none: str = ""  # when there is no source: why


def under(path: str, mounts) -> str | None:
    """The path on the host of a container ``path`` under one of ``mounts`` ((source, target), the
    deepest target wins), or None."""
    norm = posixpath.normpath(path) if path.startswith("/") else None
    if norm is None:
        return None
    best = None
    for source, target in mounts:
        t = posixpath.normpath(target)
        if norm == t or norm.startswith(t.rstrip("/") + "/"):
            if best is None or len(t) > len(best[1]):
                best = (source, t)
    if best is None:
        return None
    rest = norm[len(best[1]):].lstrip("/")
    return posixpath.join(best[0], rest) if rest else best[0]


def plan(paths: dict[str, str], *, here: Callable[[str], bool], head: str | None = None, mounts=(),
         image: str | None = None, hub: str | None = None) -> list[Want]:
    """Pure: for each model path the checks cannot read as it is, the sources to fetch its small files
    from, in order. ``here``: whether a folder is on this machine; ``mounts``: (source, target) of the
    run's mounts on the head; ``head``: the head node's name (None: no cluster given); ``image``: the
    image the checks run in (its containers see none of this machine's folders: a folder here is copied
    too; without one the checks run here and read such a folder as it is); ``hub``: the hub's URL."""
    by_path: dict[str, list[str]] = {}
    for key, path in paths.items():
        by_path.setdefault(path, []).append(key)
    out = []
    for path, keys in by_path.items():
        sources: list[Source] = []
        why = ""
        if here(path):
            if image:
                out.append(Want(path, tuple(sorted(keys)), (Source("here", "this machine", path),)))
            continue
        host_path = under(path, mounts)
        if host_path is not None:
            if here(host_path):
                sources.append(Source("here", "this machine", host_path))
            elif head:
                sources.append(Source("host", head, host_path))
            else:
                why = f"it is under the mount of {host_path}, which is not on this machine (give the cluster: --hosts or --cluster)"
        elif path.startswith("/"):
            if image:
                sources.append(Source("image", image, path))
            else:
                why = "it is under none of the run's mounts, so only an image could hold it (give --image, or the run's --mount)"
        if is_hub_name(path) and hub:
            sources.append(Source("hub", hub, path))
        elif not sources and not why:
            why = "it is neither an absolute path nor a hub name (namespace/name)"
        out.append(Want(path, tuple(sorted(keys)), tuple(sources), why))
    return out


def overrides(copies: dict[str, str], paths: dict[str, str]) -> list[str]:
    """Hydra overrides pointing each model key whose path was fetched at the local copy."""
    from rlbox.core import quote

    return [f"++{key}={quote.hydra_value(copies[path], string=True)}" for key, path in sorted(paths.items())
            if path in copies]


# ---------------------------------------------------------------------------------------------
# Fetching: the shared parts of the sources.

def find_argv(folder: str) -> list[str]:
    """The files directly in ``folder`` under the size cap (symbolic links followed: a hub cache's snapshot)."""
    if not folder.startswith("/"):
        raise RlboxError(f"model path {folder!r} is not absolute")
    return ["find", "-L", folder, "-maxdepth", "1", "-type", "f", "-size", f"-{MAX_FILE // 1024 + 1}k"]


def tar_argv(folder: str, names: list[str]) -> list[str]:
    return ["tar", "-C", folder, "-chf", "-", "--", *names]


def names_of(listing: str) -> list[str]:
    """The wanted names in a ``find`` listing (one path a line)."""
    return wanted(posixpath.basename(line) for line in listing.splitlines() if line.strip())


def extract(data: bytes, dest: Path, names: list[str], origin: str) -> list[str]:
    """Write the files of the tar ``data`` that are among ``names`` into ``dest``: regular files only,
    plain names only (nothing lands outside ``dest``), each and all under the caps."""
    dest.mkdir(parents=True, exist_ok=True)
    asked, got, total = set(names), [], 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar:
                if m.name not in asked or not safe_name(m.name):
                    raise RlboxError(f"refusing {m.name[:80]!r} from {origin}: not a file that was asked for")
                if not m.isfile():
                    raise RlboxError(f"refusing {m.name!r} from {origin}: not a regular file")
                if m.size > MAX_FILE or total + m.size > MAX_TOTAL:
                    raise RlboxError(f"refusing {m.name!r} from {origin}: {m.size} bytes, over the cap")
                total += m.size
                write(dest, m.name, tar.extractfile(m).read())
                got.append(m.name)
    except tarfile.TarError as err:
        raise RlboxError(f"the model's files from {origin}: not a tar archive ({err})") from None
    return sorted(got)


def write(dest: Path, name: str, body: bytes) -> None:
    if not safe_name(name):
        raise RlboxError(f"refusing to write {name[:80]!r}: not a plain file name")
    target = dest / name
    if target.resolve().parent != dest.resolve():
        raise RlboxError(f"refusing to write {name!r}: it points outside {dest}")
    target.write_bytes(body)


def from_here(source: Source, dest: Path) -> list[str]:
    folder = Path(source.path)
    names = wanted(p.name for p in folder.iterdir() if p.is_file() and p.stat().st_size <= MAX_FILE) \
        if folder.is_dir() else []
    if not names:
        raise Missing(f"{source.label}: none of the model's config or tokenizer files")
    dest.mkdir(parents=True, exist_ok=True)
    for n in names:
        write(dest, n, (folder / n).read_bytes())
    return names


def from_image(client, source: Source, dest: Path) -> list[str]:
    """``find`` then ``tar`` in throw-away containers of the image (no network, its entrypoint bypassed)."""
    from docker.errors import APIError, ContainerError, ImageNotFound

    def run(argv: list[str]) -> bytes:
        try:
            return client.containers.run(source.where, argv, entrypoint=[], remove=True, network_mode="none",
                                         stderr=False)
        except ContainerError:
            raise Missing(f"{source.label}: no such folder in the image") from None
        except ImageNotFound:
            raise Missing(f"{source.label}: the image is not on this engine") from None
        except APIError as err:
            raise Missing(f"{source.label}: {err.explanation or err}") from None

    names = names_of(run(find_argv(source.path)).decode(errors="replace"))
    if not names:
        raise Missing(f"{source.label}: none of the model's config or tokenizer files")
    return extract(run(tar_argv(source.path, names)), dest, names, source.label)


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def from_hub(source: Source, dest: Path, timeout: float = 5) -> list[str]:
    """The repo's listing (``/api/models/REPO``), then each wanted top-level file (``/REPO/resolve/main/NAME``)."""
    import requests

    headers = {"Authorization": f"Bearer {os.environ['HF_TOKEN']}"} if os.environ.get("HF_TOKEN") else {}
    try:
        r = requests.get(f"{source.where}/api/models/{source.path}", timeout=timeout, headers=headers)
    except requests.RequestException as err:
        raise Missing(f"the hub {source.where} is not reachable from here ({type(err).__name__})") from None
    if r.status_code != 200:
        raise Missing(f"{source.label}: the hub answers {r.status_code}")
    try:
        siblings = [s.get("rfilename", "") for s in r.json().get("siblings", [])]
    except (ValueError, AttributeError):
        raise Missing(f"{source.label}: the hub's answer is not a model listing") from None
    names = wanted(s for s in siblings if isinstance(s, str) and "/" not in s)
    if not names:
        raise Missing(f"{source.label}: none of the model's config or tokenizer files")
    dest.mkdir(parents=True, exist_ok=True)
    total = 0
    for name in names:
        try:
            with requests.get(f"{source.where}/{source.path}/resolve/main/{name}", timeout=timeout, headers=headers,
                              stream=True) as f:
                if f.status_code != 200:
                    raise Missing(f"{source.label}: {name}: the hub answers {f.status_code}")
                body = b""
                for chunk in f.iter_content(1 << 16):
                    body += chunk
                    if len(body) > MAX_FILE or total + len(body) > MAX_TOTAL:
                        raise RlboxError(f"refusing {name!r} from {source.label}: over the cap")
        except requests.RequestException as err:
            raise Missing(f"{source.label}: {name}: {type(err).__name__}") from None
        total += len(body)
        write(dest, name, body)
    return names


# ---------------------------------------------------------------------------------------------
# All of it.

@dataclass(frozen=True)
class Fetched:
    copies: dict[str, str]  # the job's model path -> the local folder holding its small files
    lines: tuple[str, ...]  # one per model path: where its files came from, or why none came
    sources: tuple[str, ...]  # short, for the verdict line: "PATH from WHERE"


def fetcher(*, head: str | None = None, from_head=None, mounts=(), image: str | None = None, client_factory=None,
            hub: str | None = None):
    """``fetch_model(paths, dest) -> Fetched`` for ``validate.examine``: the plan and the sources of one run.
    ``from_head(source, dest)``: the head's source (the cluster layer's, over ssh)."""
    def none(source: Source, dest: Path) -> list[str]:
        raise Missing(f"{source.label}: no way to reach it")

    def image_source(source: Source, dest: Path) -> list[str]:
        return from_image(client_factory(), source, dest)

    def run(paths: dict[str, str], dest: Path) -> Fetched:
        wants = plan(paths, here=lambda p: Path(p).is_dir(), head=head, mounts=mounts, image=image, hub=hub)
        return fetch(wants, dest, {"here": from_here, "host": from_head or none,
                                   "image": image_source if client_factory else none, "hub": from_hub})
    return run


def fetch(wants: list[Want], dest: Path, fetchers: dict[str, Callable[[Source, Path], list[str]]]) -> Fetched:
    """Each path's files from its first source that has them; a ``Missing`` tries the next source,
    any other RlboxError (an unreachable head) ends validation with its one line."""
    copies, lines, short = {}, [], []
    for i, want in enumerate(wants):
        folder = dest / f"model-{i}"
        why = [want.why_none] if want.why_none else []
        for source in want.sources:
            try:
                names = fetchers[source.kind](source, folder)
            except Missing as err:
                why.append(str(err))
                continue
            size = sum((folder / n).stat().st_size for n in names)
            copies[want.path] = str(folder)
            lines.append(f"the model's files of {want.path} ({', '.join(want.keys)}): {', '.join(names)} "
                         f"({max(1, size // 1024)} kB) from {source.label}")
            short.append(f"{want.path} from {source.where if source.kind != 'here' else 'this machine'}")
            break
        else:
            lines.append(f"the model's files of {want.path}: not fetched: " + "; ".join(why or ["no source"]))
    return Fetched(copies, tuple(lines), tuple(short))
