"""The CPU training image (release verl_cpu + the verl-cpu-shims stand-in), the tiny model and
the GSM8K-format data of the CPU training test and bench (docs/cpu-training.md).

The image is built through `rlbox build verl_cpu:amd64 --standin verl-cpu-shims` with this
machine's CPU torch wheel served on the loopback index the release names (127.0.0.1:23461). Its
tag carries a digest of everything that goes into it (the release, its lock and rendered files,
the templates, the stand-in's files), so an unchanged tree reuses the image and a change rebuilds.
The model is made at test time by tools/make-tiny-model.py inside that image (no hub; ~0.6 MB,
deterministic), the data by the real `rlbox data prepare gsm8k` converter from the shipped
sample (tests/fixtures/gsm8k-sample/), served as openai/gsm8k's parquet files by a local
HF-style endpoint.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from support.hub import Hub
from support.wheel_index import REPO, WheelIndex, torch_wheel

INDEX_PORT = 23461  # images/verl_cpu.yaml components.torch.index_url
STANDIN = "verl-cpu-shims"
SAMPLE = REPO / "tests" / "fixtures" / "gsm8k-sample"
MODEL_SCRIPT = REPO / "tools" / "make-tiny-model.py"
CA = "/etc/ssl/certs/ca-certificates.crt"


def digest_of(release: str) -> str:
    """12 hex digits over everything that goes into RELEASE's image and its stand-in layer."""
    files = [REPO / "images" / n for n in ("defaults.yaml", "rlbox_sim.yaml", f"{release}.yaml")]
    files += [REPO / "images" / "lock" / f"{release}.json"]
    files += sorted((REPO / "dockerfiles" / release).rglob("*"))
    files += sorted((REPO / "templates").rglob("*"))
    files += sorted((REPO / "launcher" / "rlbox" / "resources" / "standins" / STANDIN).rglob("*"))
    files += [REPO / "launcher" / "rlbox" / "image" / "standins.py"]
    h = hashlib.sha256()
    for f in files:
        if f.is_file() and "__pycache__" not in f.parts:
            h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def digest() -> str:
    return digest_of("verl_cpu")


def release_tag() -> str:
    return f"localhost/rlbox/verl-cpu:amd64-{digest()}"


def image() -> str:
    """The stand-in image a CPU training run uses."""
    return f"{release_tag()}-{STANDIN}"


def present(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


def build(index_root: Path) -> subprocess.CompletedProcess | None:
    """Build the release and the stand-in unless present; None when there is nothing to build
    with (no CPU torch wheel on this machine)."""
    if present(image()):
        return subprocess.CompletedProcess([], 0, "", "")
    wheel = torch_wheel()
    if wheel is None:
        return None
    with WheelIndex(index_root, wheel, port=INDEX_PORT):
        return subprocess.run([sys.executable, "-m", "rlbox.cli", "build", "verl_cpu:amd64", "--standin", STANDIN,
                               "--tag", release_tag(), "--network", "host", "--ca-bundle", CA],
                              cwd=REPO, text=True, capture_output=True)


# Release verl_cpu_09 (verl 0.9.1 + vLLM's CPU build, docs/cpu-training.md): its lock records PyPI's torch 2.11.0
# standing in for 2.11.0+cpu, so it is built as `rlbox rehearse verl_cpu_09:amd64 --standin verl-cpu-shims`
# (its own base; the recipes' imports checked in the layer), then tagged with a digest of what goes into it.
REHEARSAL = "localhost/rlbox-rehearsal/verl-cpu-09:amd64"


def digest09() -> str:
    return digest_of("verl_cpu_09")


def release_tag09() -> str:
    return f"{REHEARSAL}-{digest09()}"


def image09() -> str:
    """The stand-in image the verl 0.9.1 + vLLM job, `rlbox serve` and `rlbox merge` use."""
    return f"{release_tag09()}-{STANDIN}"


def build09() -> subprocess.CompletedProcess:
    """The rehearsal of verl_cpu_09 and its stand-in layer, unless an image of this content is present."""
    if present(image09()):
        return subprocess.CompletedProcess([], 0, "", "")
    proc = subprocess.run([sys.executable, "-m", "rlbox.cli", "rehearse", "verl_cpu_09:amd64", "--standin", STANDIN,
                           "--ca-bundle", CA, "--report", str(REPO / "build" / "rehearsal" / "verl_cpu_09-amd64-tests.json")],
                          cwd=REPO, text=True, capture_output=True)
    if proc.returncode != 0:
        return proc
    for src, dst in ((REHEARSAL, release_tag09()), (f"{REHEARSAL}-{STANDIN}", image09())):
        tagged = subprocess.run(["docker", "tag", src, dst], text=True, capture_output=True)
        if tagged.returncode != 0:
            return tagged
    return proc


def sample_rows(split: str) -> list[dict]:
    return [json.loads(line) for line in (SAMPLE / f"{split}.jsonl").read_text().splitlines() if line.strip()]


def make_model(img: str, data: Path) -> subprocess.CompletedProcess:
    """tools/make-tiny-model.py in the image -> DATA/models/tiny-qwen2."""
    return subprocess.run(["docker", "run", "--rm", "--network", "none", "--user", "0",
                           "-v", f"{MODEL_SCRIPT}:/tmp/make-tiny-model.py:ro", "-v", f"{SAMPLE}:/sample:ro",
                           "-v", f"{data}:/data", img, "python3", "/tmp/make-tiny-model.py", "/data/models/tiny-qwen2",
                           "--corpus", "/sample/train.jsonl"], text=True, capture_output=True)


def make_data(img: str, data: Path, hub_root: Path) -> subprocess.CompletedProcess:
    """`rlbox data prepare gsm8k` (the real converter) from the sample -> DATA/datasets/gsm8k/."""
    hub = Hub(hub_root)
    try:
        hub.put("openai/gsm8k", "main/train-00000-of-00001.parquet", sample_rows("train"))
        hub.put("openai/gsm8k", "main/test-00000-of-00001.parquet", sample_rows("test"))
        return subprocess.run([sys.executable, "-m", "rlbox.cli", "data", "prepare", "gsm8k", "--image", img,
                               "--out", str(data / "datasets"), "--endpoint", hub.url],
                              cwd=REPO, text=True, capture_output=True)
    finally:
        hub.server.shutdown()
        hub.server.server_close()


def shared_folder(img: str, root: Path, hub_root: Path) -> Path:
    """``root`` made into the /data every node mounts: the tiny model and the GSM8K sample converted by
    `rlbox data prepare`, both made in ``img``."""
    made = make_model(img, root)
    assert made.returncode == 0, made.stderr[-3000:]
    prepared = make_data(img, root, hub_root)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    return root
