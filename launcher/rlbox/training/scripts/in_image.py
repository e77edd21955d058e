"""Runs INSIDE the training image (`rlbox data prepare`): download, transform, write parquet.

    python3 -c SOURCE PLAN_JSON

Standard library and pyarrow only (every verl image has pyarrow; nothing of verl is imported).
PLAN_JSON: {"out": DIR, "overwrite": bool, "steps": [STEP, ...]}, each STEP one output file:
  {"save": REL, "url": URL}                                   download as is
  {"save": REL, "url": URL, "transform": "gsm8k"|"geo3k", "split": S}   download, convert
  {"save": REL, "input": PATH, "transform": "custom", "mapping": {...}} convert a JSON/JSONL
A file already at DIR/REL is skipped unless overwrite. Every line this prints starts with
"rlbox-data: "; a failure is one "rlbox-data: error: ..." line and exit status 3.

The conversions follow verl's examples/data_preprocess (gsm8k.py, geo3k.py) and seed 001's
DianJin data_preprocess.py; rlbox's own code, written for verl's RL parquet layout:
data_source, prompt [{role: user, content}], ability, reward_model {style, ground_truth},
extra_info {split, index, answer, question} (+ images for geo3k).
"""

import json
import os
import re
import sys
import tempfile
import urllib.error
import urllib.request

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
GEO3K_INSTRUCTION = (
    r"You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
    r"The reasoning process MUST BE enclosed within <think> </think> tags. "
    r"The final answer MUST BE put in \boxed{}."
)


class Failure(Exception):
    pass


def say(text):
    print(f"rlbox-data: {text}", flush=True)


def download(url, dest):
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    request = urllib.request.Request(url, headers={"User-Agent": "rlbox-data"})
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".rlbox-")
    try:
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(request, timeout=60) as resp:
            size = 0
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                f.write(chunk)
                size += len(chunk)
        os.replace(tmp, dest)
        return size
    except urllib.error.HTTPError as err:
        raise Failure(f"GET {url}: HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        raise Failure(f"GET {url}: cannot reach it ({getattr(err, 'reason', err)})") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def gsm8k_rows(rows, split):
    out = []
    for index, row in enumerate(rows):
        answer = row["answer"]
        found = re.search(r"#### (\-?[0-9\.\,]+)", answer)
        if not found:
            raise Failure(f"gsm8k {split} row {index}: no '#### <number>' in the answer")
        out.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": row["question"] + " " + GSM8K_INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": found.group(1).replace(",", "")},
            "extra_info": {"split": split, "index": index, "answer": answer, "question": row["question"]},
        })
    return out


def geo3k_rows(rows, split):
    return [{
        "data_source": "hiyouga/geometry3k",
        "prompt": [{"role": "user", "content": row["problem"] + " " + GEO3K_INSTRUCTION}],
        "images": row["images"],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": row["answer"]},
        "extra_info": {"split": split, "index": index, "answer": row["answer"], "question": row["problem"]},
    } for index, row in enumerate(rows)]


def read_json_records(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        records = json.loads(text)
    else:
        records = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError as err:
                    raise Failure(f"{path}:{lineno}: not JSON ({err})") from None
    if not all(isinstance(r, dict) for r in records):
        raise Failure(f"{path}: expected JSON objects (an array of them, or one per line)")
    return records


def field(record, name, index, what):
    if name not in record:
        raise Failure(f"record {index}: no field '{name}' (the spec's {what}); it has: {', '.join(sorted(record))}")
    value = record[name]
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def ground_truth(text, spec, index):
    for n, pattern in enumerate(spec.get("extract") or [], 1):
        found = re.search(pattern, text, re.DOTALL)
        if not found:
            return None, f"record {index}: ground_truth.extract pattern {n} ({pattern}) matched nothing"
        text = found.group(1) if found.groups() else found.group(0)
    if spec.get("choices"):
        text = "".join(c for c in spec["choices"] if c in text)
    return text.strip(), None


def custom_rows(records, m):
    out, skipped = [], 0
    for index, record in enumerate(records):
        question = field(record, m["prompt"], index, "prompt")
        answer = field(record, m["answer"], index, "answer") if m.get("answer") else ""
        source = field(record, m["ground_truth"]["field"], index, "ground_truth.field")
        truth, problem = ground_truth(source, m["ground_truth"], index)
        if problem:
            if m.get("skip_unmatched"):
                skipped += 1
                continue
            raise Failure(problem + " (set skip_unmatched: true to drop such records)")
        data_source = field(record, m["data_source_field"], index, "data_source_field") if m.get("data_source_field") else m["data_source"]
        ability = field(record, m["ability_field"], index, "ability_field") if m.get("ability_field") else m["ability"]
        extra = {"split": m["split"], "index": index, "answer": answer, "question": question}
        for key, name in (m.get("extra_info") or {}).items():
            extra[key] = field(record, name, index, f"extra_info.{key}")
        out.append({
            "data_source": data_source,
            "prompt": [{"role": "user", "content": question + m.get("prompt_suffix", "")}],
            "ability": ability,
            "reward_model": {"style": m.get("reward_style", "rule"), "ground_truth": truth},
            "extra_info": extra,
        })
    return out, skipped


def write(rows, dest):
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = os.path.join(os.path.dirname(dest), ".rlbox-" + os.path.basename(dest))
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    os.replace(tmp, dest)


def step(plan, s):
    dest = os.path.join(plan["out"], s["save"])
    if os.path.exists(dest) and not plan["overwrite"]:
        say(f"skip {dest} (exists; --overwrite replaces it)")
        return
    kind = s.get("transform")
    if not kind:
        size = download(s["url"], dest)
        say(f"downloaded {dest} ({size} bytes) from {s['url']}")
        return
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise Failure(f"{sys.executable} has no pyarrow: this image cannot write parquet") from None
    if kind == "custom":
        rows, skipped = custom_rows(read_json_records(s["input"]), s["mapping"])
        write(rows, dest)
        say(f"wrote {dest} ({len(rows)} rows{f', {skipped} skipped' if skipped else ''}) from {s['input']}")
        return
    with tempfile.TemporaryDirectory(dir=plan["out"], prefix=".rlbox-raw-") as raw_dir:
        raw = os.path.join(raw_dir, "raw.parquet")
        download(s["url"], raw)
        rows = pq.read_table(raw).to_pylist()
    convert = {"gsm8k": gsm8k_rows, "geo3k": geo3k_rows}[kind]
    try:
        out = convert(rows, s["split"])
    except KeyError as err:
        raise Failure(f"{s['url']}: the {kind} file has no column {err}") from None
    write(out, dest)
    say(f"wrote {dest} ({len(out)} rows, {kind} {s['split']}) from {s['url']}")


def main(argv):
    plan = json.loads(argv[0])
    try:
        os.makedirs(plan["out"], exist_ok=True)
        for s in plan["steps"]:
            step(plan, s)
    except Failure as err:
        say(f"error: {err}")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
