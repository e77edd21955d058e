"""Why did the job fail: collect a run's logs from every node and match known failure signatures.

Collection (into ``runs/NAME/triage/``): the job's log as rlbox saved it (``job/``), and from
every node's container, through the same engine connections the run uses (docker-py
``get_archive``, so it works on a stopped container too): CANN's plog directory
(``/root/ascend/log/debug/plog``, and ``$ASCEND_PROCESS_LOG_PATH`` when the run sets it) and
Ray's session logs (``/tmp/ray/session_latest/logs``: every ``*.err``, ``*.out`` and
``dashboard_agent.log``, where seed 004 found the port conflict behind "No available agent").
Each file keeps at most its last FILE_CAP bytes, each node at most NODE_CAP, and no more than
STREAM_CAP is read from a node, so a huge log cannot stall the teardown that follows.

Matching: the signatures of ``resources/signatures.yaml``, regexes over every collected line (colour
codes removed). The report names each signature that matched once, with its first line
(file:line), how many more there were, and the fix.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlbox.core.config import load_yaml, read_text, validate
from rlbox.core.errors import RlboxError
from rlbox.core.paths import RESOURCES

SIGNATURES = RESOURCES / "signatures.yaml"
PLOG_DIR = "/root/ascend/log/debug/plog"
RAY_LOGS = "/tmp/ray/session_latest/logs"
FILE_CAP = 4 << 20  # bytes kept per file (its end, where the error is)
NODE_CAP = 64 << 20  # bytes kept per node
STREAM_CAP = 512 << 20  # bytes read per node
HITS_KEPT = 20  # per signature, in the JSON report
LINE_SHOWN = 240

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


class Signature(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    title: str
    patterns: list[str] = Field(default_factory=list)
    weak: list[str] = Field(default_factory=list)
    unless: list[str] = Field(default_factory=list)
    explain: str
    fix: str
    source: str
    retryable: bool = False  # transient: `rlbox run --max-restarts` restarts the cluster for it

    @field_validator("patterns", "weak")
    @classmethod
    def _compiles(cls, value: list[str]) -> list[str]:
        for p in value:
            try:
                re.compile(p)
            except re.error as err:
                raise ValueError(f"{p!r}: {err}") from None
        return value

    def compiled(self) -> tuple[re.Pattern | None, re.Pattern | None]:
        def one(ps):
            return re.compile("|".join(f"(?:{p})" for p in ps)) if ps else None

        return one(self.patterns), one(self.weak)


def load_signatures(path: Path = SIGNATURES) -> list[Signature]:
    data = load_yaml(read_text(path), str(path))  # the one bounded loader; one line on a problem
    try:
        items = list(data["signatures"])
    except (KeyError, TypeError) as err:
        raise RlboxError(f"{path}: cannot read the signatures ({type(err).__name__})") from None
    sigs = [validate(Signature, item, f"{path}: signatures.{i}") for i, item in enumerate(items)]
    ids = [s.id for s in sigs]
    for s in sigs:
        if ids.count(s.id) > 1:
            raise RlboxError(f"{path}: signature id '{s.id}' appears twice")
        if not s.patterns and not s.weak:
            raise RlboxError(f"{path}: {s.id}: no patterns")
        for u in s.unless:
            if u not in ids:
                raise RlboxError(f"{path}: {s.id}: unless names no signature '{u}'")
    return sigs


# -- matching ----------------------------------------------------------------------------------
@dataclass
class Hit:
    file: Path
    line: int
    text: str
    start: int = 0


@dataclass
class Finding:
    signature: Signature
    hits: list[Hit]
    count: int
    files: int


def _shown(hit: Hit) -> str:
    text = hit.text.strip()
    if len(text) <= LINE_SHOWN:
        return text
    lo = max(0, min(hit.start - 60, len(text) - LINE_SHOWN))
    return ("..." if lo else "") + text[lo:lo + LINE_SHOWN] + "..."


def scan(files: list[Path], signatures: list[Signature] | None = None) -> list[Finding]:
    """Every signature that matches a line of ``files``, in the corpus's order."""
    signatures = signatures if signatures is not None else load_signatures()
    compiled = [(s, *s.compiled()) for s in signatures]
    every = re.compile("|".join(f"(?:{p})" for s in signatures for p in [*s.patterns, *s.weak]))
    strong: dict[str, list[Hit]] = {s.id: [] for s in signatures}
    weak: dict[str, list[Hit]] = {s.id: [] for s in signatures}
    for path in files:
        try:
            handle = path.open(encoding="utf-8", errors="replace")
        except OSError:
            continue
        with handle:
            for number, raw in enumerate(handle, 1):
                line = _ANSI.sub("", raw.rstrip("\n"))
                if not every.search(line):
                    continue
                for sig, pat, wpat in compiled:
                    m = pat.search(line) if pat else None
                    if m:
                        strong[sig.id].append(Hit(path, number, line, m.start()))
                        continue
                    m = wpat.search(line) if wpat else None
                    if m:
                        weak[sig.id].append(Hit(path, number, line, m.start()))
    found = {sid for sid in strong if strong[sid] or weak[sid]}
    findings = []
    for sig in signatures:
        hits = strong[sig.id] + ([] if any(u in found for u in sig.unless) else weak[sig.id])
        if hits:
            hits.sort(key=lambda h: (str(h.file), h.line))
            findings.append(Finding(sig, hits[:HITS_KEPT], len(hits), len({h.file for h in hits})))
    return findings


# -- collection --------------------------------------------------------------------------------
class _Chunks(io.RawIOBase):
    """A file over docker-py's archive chunks, which stops after ``limit`` bytes."""

    def __init__(self, chunks, limit: int):
        self._it = iter(chunks)
        self._buf = b""
        self.consumed = 0
        self.limit = limit
        self.cut = False

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            if self.consumed >= self.limit:
                self.cut = True
                return 0
            try:
                self._buf = next(self._it)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        self.consumed += n
        return n


def _ray_file(parts: tuple[str, ...]) -> bool:
    return len(parts) == 1 and (parts[0].endswith((".err", ".out")) or parts[0] == "dashboard_agent.log")


def extract(chunks, dest: Path, keep=lambda parts: True, *, file_cap: int = FILE_CAP,
            total_cap: int = NODE_CAP, stream_cap: int = STREAM_CAP) -> tuple[int, int, bool]:
    """Write the regular files of a tar stream (a directory archive: its first path component is
    the directory) under ``dest``, each cut to its last ``file_cap`` bytes. Returns files, bytes
    written, and whether a cap cut anything."""
    reader = _Chunks(chunks, stream_cap)
    files = written = 0
    cut = False
    try:
        with tarfile.open(fileobj=io.BufferedReader(reader, 1 << 20), mode="r|") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts[1:]
                if not member.isfile() or not parts or ".." in parts or not keep(parts):
                    continue
                if written >= total_cap:
                    cut = True
                    break
                handle = tar.extractfile(member)
                tail = bytearray()
                while chunk := handle.read(1 << 20):
                    tail += chunk
                    if len(tail) > file_cap:
                        del tail[:len(tail) - file_cap]
                dropped = member.size - len(tail)
                target = dest.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("wb") as f:
                    if dropped > 0:
                        cut = True
                        f.write(f"[rlbox: the first {dropped} bytes of this file were left out]\n".encode())
                    f.write(tail)
                files += 1
                written += len(tail)
    except (tarfile.TarError, EOFError):
        cut = True  # the stream stopped at STREAM_CAP (or broke): keep what came
    return files, written, cut or reader.cut


def _env(box) -> dict[str, str]:
    pairs = (e.split("=", 1) for e in (box.attrs.get("Config") or {}).get("Env") or [] if "=" in e)
    return dict(pairs)


def collect_node(client, container: str, dest: Path, job_env: dict[str, str] | None = None) -> str:
    """One node's CANN plog and Ray logs into ``dest``; a one-line summary of what came."""
    from docker.errors import NotFound

    try:
        box = client.containers.get(container)
    except NotFound:
        raise RlboxError(f"container {container} is gone") from None
    sources = [("plog", PLOG_DIR, lambda parts: True)]
    extra = (job_env or {}).get("ASCEND_PROCESS_LOG_PATH") or _env(box).get("ASCEND_PROCESS_LOG_PATH")
    if extra and extra.rstrip("/") != PLOG_DIR:
        sources.append(("ascend_process_log", extra, lambda parts: True))
    sources.append(("ray", RAY_LOGS, _ray_file))
    said = []
    for label, path, keep in sources:
        try:
            chunks, _ = box.get_archive(path)
        except NotFound:
            continue
        try:
            files, _, cut = extract(chunks, dest / label, keep)
        finally:
            close = getattr(chunks, "close", None)
            if close:
                close()  # a stream cut at a cap: release its connection now
        said.append(f"{label} {files}" + (" (capped)" if cut else ""))
    return ", ".join(said) or "nothing"


# -- the report --------------------------------------------------------------------------------
@dataclass
class Report:
    run: str
    folder: Path
    files: list[Path]
    findings: list[Finding]
    collected: dict[str, str] = field(default_factory=dict)  # node label -> what came
    warnings: list[str] = field(default_factory=list)
    job_log: Path | None = None

    def as_dict(self) -> dict:
        return {
            "run": self.run,
            "folder": str(self.folder),
            "job_log": str(self.job_log) if self.job_log else None,
            "collected": self.collected,
            "files_scanned": len(self.files),
            "warnings": self.warnings,
            "findings": [
                {"id": f.signature.id, "title": f.signature.title, "explain": f.signature.explain,
                 "fix": f.signature.fix, "source": f.signature.source, "count": f.count, "files": f.files,
                 "hits": [{"file": str(h.file), "line": h.line, "text": _shown(h)} for h in f.hits]}
                for f in self.findings
            ],
        }


def retryable(report: Report) -> str | None:
    """The cause to restart for, when the first known failure is a transient one (None when the
    first is not: a config or environment mistake fails again after any restart)."""
    if not report.findings or not report.findings[0].signature.retryable:
        return None
    sig = report.findings[0].signature
    return f"job failed: {sig.title} [{sig.id}] (triage)"


def _display(path: Path) -> str:
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else str(path)


def render(report: Report) -> list[str]:
    """The short report: per known failure its first line, how many more, and the fix."""
    where = _display(report.folder)
    got = "; ".join(f"{k}: {v}" for k, v in report.collected.items())
    lines = [f"triage: {len(report.findings) or 'no'} known failure(s) in {len(report.files)} file(s) under {where}"
             + (f" ({got})" if got else "")]
    lines += [f"triage: warning: {w}" for w in report.warnings]
    if not report.findings:
        lines.append("no known signature matched"
                     + (f"; the error is in the job log: {_display(report.job_log)}" if report.job_log else ""))
        return lines
    for f in report.findings:
        first = f.hits[0]
        lines.append(f"✗ {f.signature.title} [{f.signature.id}]")
        lines.append(f"  {_display(first.file)}:{first.line}: {_shown(first)}")
        if f.count > 1:
            lines.append(f"  (and {f.count - 1} more line(s)" + (f" in {f.files} file(s))" if f.files > 1 else ")"))
        lines.append(f"  fix: {' '.join(f.signature.fix.split())}")
    return lines


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def triage(run: str, run_dir: Path, *, job_log: Path | None, targets=None,
           job_env: dict[str, str] | None = None) -> Report:
    """Collect (when ``targets`` are given: (label, docker client, container) per node) and match.

    Without targets (the run's containers are gone) what an earlier triage collected is matched
    again, with the job log."""
    folder = run_dir / "triage"
    warnings = []
    if targets is not None:
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    if job_log is not None and job_log.is_file():
        for old in (folder / "job").glob("*.log"):
            if old.name != job_log.name:
                old.unlink()
        _link(job_log, folder / "job" / job_log.name)
    collected = {}
    if targets:
        def one(target):
            label, client, container = target
            try:
                return label, collect_node(client, container, folder / label, job_env), None
            except Exception as err:  # noqa: BLE001 - one node's failure is a warning, the others go on
                return label, None, f"{label}: {' '.join(str(err).split())[:200]}"

        with ThreadPoolExecutor(max_workers=len(targets)) as pool:
            for label, said, error in pool.map(one, targets):
                if error:
                    warnings.append(error)
                else:
                    collected[label] = said
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "report.json")
    report = Report(run, folder, files, scan(files), collected, warnings, job_log)
    (folder / "report.json").write_text(json.dumps(report.as_dict(), indent=2))
    return report
