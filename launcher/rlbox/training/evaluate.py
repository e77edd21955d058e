"""`rlbox eval`: AISBench against an OpenAI endpoint, N times, averaged (seed 000 section 3).

rlbox writes AISBench's model config ``configs/models/vllm_api/vllm_api_general.py`` into a
work folder, with the seed's fields (host_ip, host_port, max_seq_len, max_out_len, batch_size,
generation_kwargs) set for the server, then runs, from that folder, exactly the seed's command
``ais_bench --models vllm_api_general --datasets aime2024_gen`` (plus ``--work-dir`` so each
repeat has its own output folder). AISBench looks for configs in ``./configs`` before its own,
so this file wins without editing the installed package. Each repeat's summary (the csv under
``<work-dir>/<timestamp>/summary/``, columns ``dataset,version,metric,mode,vllm-api-general``,
a value such as ``45.33`` or ``45.33 (14/30)``) is parsed; the repeats are averaged.

Run for real with AISBench 3.1.20260630 from PyPI (ais-bench-benchmark; the tests' venv is
installed by .ci/provision from tools/aisbench/requirements.lock): its VLLMCustomAPI no longer
takes ``max_seq_len``; rlbox reads which fields the installed one takes and leaves out the ones
it does not (with a note), so the seed's config works on old and new releases. AISBench writes,
under ``<work-dir>/<timestamp>/``, its summary (``summary/summary_<ts>.{csv,md,txt}``), the
per-dataset result (``results/vllm-api-general/<dataset>.json``), the predictions and its logs.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

import requests
from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlbox.core.config import load_file
from rlbox.core.errors import RlboxError

# rlbox's dataset names -> AISBench dataset configs (seed 000: aime2024; seed 001: MATH-500; gsm8k:
# AISBench's 0-shot chain-of-thought task, plain-string prompt "Question: ...\nLet's think step by
# step\nAnswer:", as verl's GSM8K models are trained 0-shot; it reads
# ais_bench/datasets/gsm8k/{train,test}.jsonl under AIS_BENCH_DATASETS_CACHE. AISBench's default,
# --dataset gsm8k_gen_4_shot_cot_str, puts 4 worked examples, ~5 kB of text, before each question).
DATASETS = {"aime2024": "aime2024_gen", "math500": "math_prm800k_500_0shot_cot_gen", "gsm8k": "gsm8k_gen_0_shot_cot_str"}
# Files AISBench's loader reads under AIS_BENCH_DATASETS_CACHE, checked before a run (rlbox's names).
DATASET_FILES = {"gsm8k": ("ais_bench/datasets/gsm8k", ("train.jsonl", "test.jsonl"), ("question", "answer"))}
MODEL_ABBR = "vllm-api-general"
BUILDER_KEYS = {"attr", "abbr", "request_rate", "batch_size", "use_timestamp", "run_cfg", "min_out_len"}

# Seed 000 section 3.3.2 (2k prompt, 20k output: max_seq_len + max_out_len = max-model-len 22528).
GENERATION = {"temperature": 0.5, "top_k": 10, "top_p": 0.95, "seed": None, "repetition_penalty": 1.03}
MAX_SEQ_LEN = 2048
BATCH_SIZE = 48

CONFIG_TEMPLATE = '''\
# Written by rlbox eval for {endpoint} (seed 000 section 3.3.2's fields).
from ais_bench.benchmark.models import VLLMCustomAPI

models = [
    dict(
{fields}
    )
]
'''


@dataclass(frozen=True)
class Endpoint:
    url: str  # http://host:port (no /v1)
    host: str
    port: int
    max_model_len: int | None = None
    source: str = "--endpoint"

    @classmethod
    def parse(cls, text: str, max_model_len: int | None = None, source: str = "--endpoint") -> "Endpoint":
        u = urlparse(text if "://" in text else f"http://{text}")
        if u.scheme not in ("http", "https") or not u.hostname:
            raise RlboxError(f"--endpoint {text!r}: give http://HOST:PORT (the server's OpenAI endpoint)")
        port = u.port or (443 if u.scheme == "https" else 80)
        return cls(f"{u.scheme}://{u.hostname}:{port}", u.hostname, port, max_model_len, source)


def check_endpoint(ep: Endpoint) -> str:
    """The served model's id; one line naming the endpoint when it does not answer."""
    try:
        resp = requests.get(f"{ep.url}/v1/models", timeout=10)
    except requests.RequestException as err:
        raise RlboxError(f"endpoint {ep.url} ({ep.source}) does not answer ({type(err).__name__}); "
                         "is the server up? (rlbox serve MODEL)") from None
    try:
        return resp.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise RlboxError(f"endpoint {ep.url}/v1/models answered {resp.status_code} without a model list") from None


def config_fields(ep: Endpoint, *, max_seq_len: int, max_out_len: int, batch_size: int, generation: dict,
                  accepted: set[str] | None) -> tuple[dict, list[str]]:
    """The seed's model config for this endpoint; fields the installed AISBench refuses dropped."""
    fields = {
        "attr": "service", "type": "VLLMCustomAPI", "abbr": MODEL_ABBR, "path": "", "model": "",
        "request_rate": 0, "retry": 2, "host_ip": ep.host, "host_port": ep.port,
        "enable_ssl": ep.url.startswith("https://"),
        "max_seq_len": max_seq_len, "max_out_len": max_out_len, "batch_size": batch_size,
        "trust_remote_code": False, "generation_kwargs": generation,
    }
    dropped = []
    if accepted is not None:
        for key in list(fields):
            if key not in ("attr", "type", "abbr") and key not in accepted:
                dropped.append(key)
                del fields[key]
    return fields, dropped


def render_config(fields: dict, endpoint: str) -> str:
    def py(v):
        if isinstance(v, dict):
            return "dict(\n" + "".join(f"            {k}={py(x)},\n" for k, x in v.items()) + "        )"
        return repr(v)

    body = "".join(f"        {k}={v if k == 'type' else py(v)},\n" for k, v in fields.items())
    return CONFIG_TEMPLATE.format(endpoint=endpoint, fields=body.rstrip("\n"))


def ais_bench_fields(executable: str) -> set[str] | None:
    """The keyword arguments the installed AISBench's VLLMCustomAPI takes (None: cannot tell)."""
    try:
        first = Path(executable).read_text(errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return None
    if not first.startswith("#!") or "python" not in first:
        return None
    python = first[2:].strip().split()[0]
    # The model class gets the config minus the keys AISBench's builder pops for itself
    # (utils/config/build.py: abbr, attr, request_rate, batch_size, ...); those always stay.
    # Read from the class's source (ast): importing ais_bench (torch and all) takes 30-90 s here;
    # if the class is not where 3.1 keeps it, import it.
    probe = ("import ast, importlib.util, inspect, os, sys\n"
             "spec = importlib.util.find_spec('ais_bench')\n"
             "src = os.path.join(os.path.dirname(spec.origin), 'benchmark', 'models', 'api_models', 'vllm_custom_api.py') if spec and spec.origin else ''\n"
             "tree = ast.parse(open(src).read()) if os.path.isfile(src) else None\n"
             "cls = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == 'VLLMCustomAPI'] if tree else []\n"
             "init = [f for f in cls[0].body if isinstance(f, ast.FunctionDef) and f.name == '__init__'] if cls else []\n"
             "if init:\n"
             "    a = init[0].args\n"
             "    print('*' if a.kwarg else ' '.join(x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg != 'self'))\n"
             "    sys.exit()\n"
             "from ais_bench.benchmark.models import VLLMCustomAPI as C\n"
             "ps = inspect.signature(C.__init__).parameters.values()\n"
             "print('*' if any(p.kind == p.VAR_KEYWORD for p in ps) else ' '.join(p.name for p in ps if p.name != 'self'))")
    try:
        proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0 or not proc.stdout.strip() or proc.stdout.strip() == "*":
        return None
    return set(proc.stdout.split()) | BUILDER_KEYS


# ---------------------------------------------------------------------------------------------
@dataclass
class Row:
    dataset: str
    version: str
    metric: str
    mode: str
    value: float | None
    raw: str


_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")


def parse_summary_csv(text: str, model_abbr: str = MODEL_ABBR) -> list[Row]:
    """AISBench's summary csv: dataset,version,metric,mode[,total_count],<model abbr>..."""
    rows = list(csv.reader(text.splitlines()))
    if not rows or rows[0][:4] != ["dataset", "version", "metric", "mode"]:
        raise ValueError("not an AISBench summary (header dataset,version,metric,mode,...)")
    header = rows[0]
    if model_abbr not in header:
        raise ValueError(f"no column {model_abbr} in the summary (columns: {', '.join(header)})")
    col = header.index(model_abbr)
    out = []
    for r in rows[1:]:
        if len(r) <= col:
            continue
        m = _NUMBER.match(r[col])
        out.append(Row(r[0], r[1], r[2], r[3], float(m.group(1)) if m else None, r[col]))
    return out


def parse_summary_md(text: str, model_abbr: str = MODEL_ABBR) -> list[Row]:
    """AISBench's summary markdown (summary_<ts>.md): | dataset | version | metric | mode | <abbr> |."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.strip().startswith("|")]
    if not rows or rows[0][:4] != ["dataset", "version", "metric", "mode"]:
        raise ValueError("not an AISBench summary (header | dataset | version | metric | mode | ...)")
    return parse_summary_csv("\n".join(",".join(r) for r in rows if not set("".join(r)) <= set("-: ")), model_abbr)


def parse_summary_table(text: str, model_abbr: str = MODEL_ABBR) -> list[Row]:
    """The table AISBench prints (tabulate's plain format: header, dashes, rows)."""
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        words = line.split()
        if words[:4] == ["dataset", "version", "metric", "mode"] and model_abbr in words and set(lines[i + 1].replace(" ", "")) == {"-"}:
            col = words.index(model_abbr)
            out = []
            for row in lines[i + 2:]:
                cells = row.split()
                if len(cells) <= col or row.startswith(("[", " ")):  # the table ends at the next log line
                    break
                m = _NUMBER.match(cells[col])
                out.append(Row(cells[0], cells[1], cells[2], cells[3], float(m.group(1)) if m else None, " ".join(cells[col:])))
            return out
    raise ValueError("no summary table in the output")


@dataclass
class Run:
    index: int
    value: float
    version: str
    summary: str
    seconds: float


@dataclass
class EvalPlan:
    model: str
    dataset: str
    ais_dataset: str
    endpoint: Endpoint
    repeat: int
    executable: str
    work: Path
    max_seq_len: int
    max_out_len: int
    batch_size: int
    generation: dict
    datasets_cache: Path | None
    runs: list[Run] = field(default_factory=list)

    def argv(self, index: int) -> list[str]:
        return [self.executable, "--models", "vllm_api_general", "--datasets", self.ais_dataset,
                "--work-dir", f"outputs/repeat_{index:02d}"]

    def describe(self) -> str:
        lines = [f"# {self.model} on {self.dataset} ({self.ais_dataset}) at {self.endpoint.url}, {self.repeat} run(s) in {self.work}"]
        lines += [shlex.join(self.argv(i)) for i in range(1, self.repeat + 1)]
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict:
        return {"model": self.model, "dataset": self.dataset, "ais_dataset": self.ais_dataset, "endpoint": self.endpoint.url,
                "repeat": self.repeat, "executable": self.executable, "work": str(self.work),
                "max_seq_len": self.max_seq_len, "max_out_len": self.max_out_len, "batch_size": self.batch_size,
                "generation": dict(self.generation), "argv": [self.argv(i) for i in range(1, self.repeat + 1)]}


def plan(*, model: str, dataset: str, endpoint: Endpoint, repeat: int, executable: str | None, out_dir: Path,
         max_seq_len: int | None, max_out_len: int | None, batch_size: int, generation: dict,
         datasets_cache: Path | None) -> EvalPlan:
    if repeat < 1:
        raise RlboxError("--repeat must be 1 or more")
    ais_dataset = DATASETS.get(dataset) or (dataset if re.fullmatch(r"[\w.-]+_gen[\w.-]*", dataset) else None)
    if not ais_dataset:
        raise RlboxError(f"--dataset {dataset}: not one rlbox knows ({', '.join(DATASETS)}); "
                         "or give an AISBench dataset config name such as aime2024_gen")
    check_dataset(dataset, datasets_cache)
    exe = executable or "ais_bench"
    found = shutil.which(exe)
    if not found:
        raise RlboxError(f"AISBench not found ({exe}): install ais-bench-benchmark in its own venv "
                         "(tools/aisbench/requirements.lock) and pass --ais-bench VENV/bin/ais_bench")
    seq = max_seq_len or MAX_SEQ_LEN
    if max_out_len is None:
        if endpoint.max_model_len and endpoint.max_model_len > seq:
            max_out_len = endpoint.max_model_len - seq
        else:
            max_out_len = 20480
    if endpoint.max_model_len and seq + max_out_len > endpoint.max_model_len:
        raise RlboxError(f"max_seq_len {seq} + max_out_len {max_out_len} exceed the server's --max-model-len "
                         f"{endpoint.max_model_len}")
    stamp = time.strftime("%Y%m%d_%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model).name or model)[:60]
    work = (out_dir / "eval" / f"{safe}-{dataset}-{stamp}").resolve()
    return EvalPlan(model, dataset, ais_dataset, endpoint, repeat, found, work, seq, max_out_len, batch_size,
                    generation, datasets_cache)


def check_dataset(dataset: str, cache: Path | None) -> None:
    """The files AISBench's loader for ``dataset`` will read, when rlbox knows them: one line
    naming the file (and the row, the field) that is missing or wrong."""
    if dataset not in DATASET_FILES or cache is None:
        return
    sub, names, fields = DATASET_FILES[dataset]
    for name in names:
        path = cache / sub / name
        if not path.is_file():
            raise RlboxError(f"--ais-datasets {cache}: no {sub}/{name} (AISBench's {dataset} loader reads "
                             f"{sub}/{{{','.join(names)}}}; e.g. copy tests/fixtures/gsm8k-sample/*.jsonl there)")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise RlboxError(f"{path}: cannot be read ({type(err).__name__})") from None
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise RlboxError(f"{path} line {i}: not JSON") from None
            if not isinstance(row, dict):
                raise RlboxError(f"{path} line {i}: not a JSON object")
            for f in fields:
                if not isinstance(row.get(f), str):
                    raise RlboxError(f"{path} line {i}: field '{f}' missing or not text")
            if dataset == "gsm8k" and "#### " not in row["answer"]:
                raise RlboxError(f"{path} line {i}: field 'answer' has no '#### ANSWER' (GSM8K's final answer)")
        if not any(line.strip() for line in lines):
            raise RlboxError(f"{path}: no rows")


def write_config(p: EvalPlan, note) -> Path:
    accepted = ais_bench_fields(p.executable)
    fields, dropped = config_fields(p.endpoint, max_seq_len=p.max_seq_len, max_out_len=p.max_out_len,
                                    batch_size=p.batch_size, generation=p.generation, accepted=accepted)
    if dropped:
        note(f"the installed AISBench's VLLMCustomAPI takes no {', '.join(dropped)}: left out of its config")
    path = p.work / "configs" / "models" / "vllm_api" / "vllm_api_general.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_config(fields, p.endpoint.url))
    return path


def _summary(work_dir: Path, started: float) -> Path | None:
    """This run's summary: AISBench's csv, else its markdown."""
    for ext in ("csv", "md"):
        found = [c for c in work_dir.glob(f"*/summary/summary_*.{ext}") if c.stat().st_mtime >= started - 1]
        if found:
            return max(found, key=lambda c: c.stat().st_mtime)
    return None


def clean_output(text: str) -> str:
    """AISBench's console output without its terminal escapes (it draws a progress screen)."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][0-9A-Za-z]|\x1b[=>]", "", text)


def parse_summary(path: Path | None, output: str) -> list[Row]:
    """The rows of AISBench's summary file (csv or md), or of the table it printed when it wrote none."""
    if path is None:
        return parse_summary_table(clean_output(output))
    text = path.read_text(encoding="utf-8", errors="replace")
    return parse_summary_md(text) if path.suffix == ".md" else parse_summary_csv(text)


def run_once(p: EvalPlan, index: int, emit) -> Run:
    env = dict(os.environ)
    if p.datasets_cache:
        env["AIS_BENCH_DATASETS_CACHE"] = str(p.datasets_cache)
    started = time.time()
    log = p.work / f"repeat_{index:02d}.log"
    with log.open("w", encoding="utf-8") as f:
        proc = subprocess.run(p.argv(index), cwd=p.work, env=env, stdout=f, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, text=True)
    output = log.read_text(errors="replace")
    clean = clean_output(output)
    last = next((line.strip() for line in reversed(clean.splitlines()) if line.strip()), "no output")
    if proc.returncode != 0:
        raise RlboxError(f"ais_bench run {index}/{p.repeat} exited with {proc.returncode}: {last} (log: {log})")
    summary = _summary(p.work / f"outputs/repeat_{index:02d}", started)
    try:
        rows = parse_summary(summary, output)
    except ValueError as err:
        raise RlboxError(f"ais_bench run {index}/{p.repeat}: {err} (log: {log})") from None
    wanted = [r for r in rows if r.dataset == p.dataset or r.dataset.startswith(p.dataset)]
    if not wanted and len({r.dataset for r in rows}) == 1:  # --dataset gave a config name; one dataset ran
        wanted = rows
    row = next((r for r in wanted if r.metric == "accuracy"), wanted[0] if wanted else None)
    if row is None or row.value is None:
        failed = re.search(r"see\s*\n?\s*(\S+logs/infer/\S+)", clean)
        why = f"its inference failed, see {p.work / failed.group(1)}" if failed else f"see {log}"
        raise RlboxError(f"ais_bench run {index}/{p.repeat} produced no accuracy for {p.dataset} "
                         f"({row.raw if row else 'no row'}): {why}")
    run = Run(index, row.value, row.version, str(summary or log), round(time.time() - started, 1))
    emit(f"run {index}/{p.repeat}: {row.dataset} {row.metric} {row.value:.2f}  ({run.seconds:.0f} s, {run.summary})")
    p.runs.append(run)
    return run


def result(p: EvalPlan, model_id: str) -> dict:
    values = [r.value for r in p.runs]
    return {
        "schema": "rlbox.eval/v1",
        "model": p.model,
        "served_model": model_id,
        "dataset": p.dataset,
        "ais_dataset": p.ais_dataset,
        "version": p.runs[0].version if p.runs else "-",
        "metric": "accuracy",
        "mode": "gen",
        "model_abbr": MODEL_ABBR,
        "repeat": p.repeat,
        "mean": round(sum(values) / len(values), 2),
        "runs": [r.__dict__ for r in p.runs],
        "endpoint": p.endpoint.url,
        "config": {"max_seq_len": p.max_seq_len, "max_out_len": p.max_out_len, "batch_size": p.batch_size,
                   "generation_kwargs": p.generation},
        "work_dir": str(p.work),
    }


class EvalResult(BaseModel):
    """An `rlbox eval` result file as read back (``result``): what `--compare` uses is typed."""

    model_config = ConfigDict(extra="allow")
    schema_: Literal["rlbox.eval/v1"] = Field(alias="schema")
    dataset: str = Field(max_length=256)
    metric: str = Field(max_length=256)
    mode: str = Field(max_length=64)
    version: str = Field("-", max_length=256)
    mean: float = Field(allow_inf_nan=False)

    @field_validator("mean", mode="before")
    @classmethod
    def _number(cls, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError("not a number")
        return v


def load_result(path: Path) -> dict:
    try:
        return load_file(path, EvalResult, str(path), fmt="json").model_dump(by_alias=True)
    except RlboxError as err:
        raise RlboxError(f"{err}; not a complete `rlbox eval` result") from None


def compare(before: dict, after: dict) -> list[list[str]]:
    if before["dataset"] != after["dataset"]:
        raise RlboxError(f"cannot compare {before['dataset']} with {after['dataset']}")
    gain = after["mean"] - before["mean"]
    return [["dataset", "version", "metric", "mode", "before", "after", "gain"],
            [after["dataset"], after.get("version", "-"), after["metric"], after["mode"], f"{before['mean']:.2f}",
             f"{after['mean']:.2f}", f"{gain:+.2f}"]]


def endpoint_for(endpoint: str | None, runs_dir: Path, name: str) -> Endpoint:
    """The server to evaluate: ``--endpoint``, else the one `rlbox serve --name NAME` started."""
    if endpoint:
        return Endpoint.parse(endpoint)
    from rlbox.training.serve import load_record, state_path as serve_record

    state_path = serve_record(runs_dir, name)
    if not state_path.is_file():
        raise RlboxError(f"eval: no --endpoint and no server named '{name}' under {runs_dir} (rlbox serve MODEL)")
    state = load_record(state_path, "url")
    return Endpoint.parse(state["url"], state.get("max_model_len"), source=f"rlbox serve --name {name}")


def evaluate(p: EvalPlan, note, path: Path) -> dict:
    """Carry out the plan: check the server, write AISBench's config, run it ``repeat`` times,
    save the averaged result to ``path``."""
    served = check_endpoint(p.endpoint)
    config = write_config(p, note)
    note(f"{config} -> {p.endpoint.url} (model '{served}', max_seq_len {p.max_seq_len}, max_out_len {p.max_out_len}); "
         f"{p.repeat} run(s) of: {' '.join(p.argv(1)[:5])}")
    for i in range(1, p.repeat + 1):
        run_once(p, i, note)
    res = result(p, served)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2))
    return res
