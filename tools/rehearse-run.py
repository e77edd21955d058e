#!/usr/bin/env python3
"""`make rehearse-run`: the CPU training job of docs/cpu-training.md on the flagship's content.

The rehearsal image of REF (default verl_pt27_25rc3:ax-x86: verl 796871d and the locked set, torch
2.7.1, on the CANN stand-in base; `make rehearse-image` builds it) gets the `verl-cpu-shims`
stand-in layer (the shims written for that verl, labelled, never in a release variant); then, as a
user runs it:

  docker run IMAGE python3 make-tiny-model.py /data/models/tiny-qwen2       (random tiny Qwen2, no hub)
  rlbox data prepare gsm8k --image IMAGE --endpoint URL                      (the real converter)
  rlbox run --sim --nodes 2 --recipe grpo-tiny-cpu --image IMAGE ... --max-restarts 1
      (node1 killed after verl's step 2: rlbox restarts, verl resumes from its checkpoint)
  rlbox metrics / rlbox merge / rlbox triage (on a failure)

and writes build/rehearse-run/REPORT.json and REPORT.md: the verdict, the figures, verl's own key log
lines, and on a failure the exact exception and the frame (file:line) it came from. Exit 0 only when
the job trained, resumed and merged. Names: run rr-train, containers rr-*, Ray ports of NPU slot 5
(25000-25999), the model and the data made as the CPU training test makes them (tests/support/verl_cpu.py).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from support import verl_cpu  # noqa: E402  (the tiny model and the GSM8K sample, as the CPU training test makes them)

OUT = REPO / "build" / "rehearse-run"
STANDIN = "verl-cpu-shims"
RUN = "rr-train"
DEVICES = "5-6"      # NPU ids 5-6: Ray ports 25000-25999 (this run's range)
CA = Path("/etc/ssl/certs/ca-certificates.crt")

# verl's and rlbox's own lines the report keeps, in order
KEY = re.compile(r"stand-in: |job overrides valid|All configuration checks passed|local_global_step_folder|"
                 r"(?<![\w/])step:\d+ - |lost: |restart \d+/\d+|cluster ready|Load from checkpoint|Setting global step|"
                 r"Resuming from|job rlbox-\S+ (SUCCEEDED|FAILED|STOPPED)|rlbox: (error|run)|"
                 r"Processing model shards|Saving model to|merged step")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its workers' prefixes
FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
EXC = re.compile(r"^(?:\(\w+ pid=\d+(?:, ip=[\d.]+)?\)\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt))"
                 r"(?::\s*(.*))?$")


# ---------------------------------------------------------------------------------------------
# Judging (pure): what the job's output says.


def first_failure(text: str) -> dict | None:
    """The first exception a traceback in ``text`` ends with, and its innermost frame in verl (or
    torch when none in verl) and innermost frame overall: {exception, message, frame, verl_frame}."""
    lines = text.splitlines()
    frames: list[tuple[str, str, str]] = []
    for line in lines:
        if "Traceback (most recent call last)" in line:
            frames = []
            continue
        f = FRAME.search(line)
        if f:
            frames.append(f.groups())
            continue
        e = EXC.match(line.strip())
        if e and frames:
            def short(fr):
                path = fr[0]
                for root in ("/site-packages/", "/opt/rlbox/src/verl/"):
                    if root in path:
                        path = path.split(root, 1)[1]
                return f"{path}:{fr[1]} ({fr[2]})"
            in_verl = [fr for fr in frames if "/verl/" in fr[0]]
            return {"exception": e.group(1), "message": (e.group(2) or "").strip()[:400],
                    "frame": short(frames[-1]), "verl_frame": short(in_verl[-1]) if in_verl else None}
    return None


def key_lines(text: str, limit: int = 60) -> list[str]:
    """rlbox's and verl's own milestone lines, step lines cut to their first metrics."""
    out = []
    for line in text.splitlines():
        if KEY.search(line):
            line = line.rstrip()
            if " step:" in line or line.startswith("step:"):
                line = line[:200] + (" ..." if len(line) > 200 else "")
            out.append(line)
    return out[-limit:] if len(out) > limit else out


def judge(run_code: int | None, output: str, steps: list[int], merge_code: int | None, merge_out: str,
          expect_steps: int) -> dict:
    """The verdict of a rehearse-run from its facts."""
    resumed = re.search(r"Resuming from \S*global_step_(\d+)", output)
    checks = {
        "job succeeded": run_code == 0,
        "a node was lost and rlbox restarted": bool(re.search(r"restart 1/1: node1", output)),
        "verl resumed from its checkpoint": resumed is not None,
        f"steps 1-{expect_steps} in the metrics": steps == list(range(1, expect_steps + 1)),
        "verl's model_merger merged the shards": merge_code == 0,
    }
    failure = None if run_code == 0 else first_failure(output)
    if run_code != 0 and failure is None:  # rlbox stopped it before verl ran: its own one-line error
        said = [ln.split("rlbox: error: ", 1)[1] for ln in output.splitlines() if "rlbox: error: " in ln]
        if said:
            failure = {"exception": "rlbox error", "message": said[-1][:400], "frame": "rlbox run", "verl_frame": None}
    return {"ok": all(checks.values()), "checks": checks, "resumed_from": int(resumed.group(1)) if resumed else None,
            "failure": failure, "merge_line": next((ln for ln in merge_out.splitlines() if "merged step" in ln), None)}


def markdown(report: dict) -> str:
    lines = [f"# make rehearse-run: {'GREEN' if report['verdict']['ok'] else 'RED'}", "",
             f"image: `{report['image']}` (stand-in {STANDIN} on the rehearsal of {report['ref']})", "",
             f"stand-in: {report['standin']['summary']}", ""]
    lines += [f"- {'ok  ' if good else 'FAIL'} {name}" for name, good in report["verdict"]["checks"].items()]
    f = report["verdict"].get("failure")
    if f:
        lines += ["", "## What fails", "", f"`{f['exception']}: {f['message']}`", "",
                  f"- raised at `{f['frame']}`", f"- in verl at `{f['verl_frame']}`" if f.get("verl_frame") else "- (no verl frame)"]
    lines += ["", "## Figures", ""] + [f"- {k}: {v}" for k, v in report["figures"].items()]
    lines += ["", "## Commands", ""] + [f"    {c}" for c in report["commands"]]
    lines += ["", "## Key lines (rlbox's and verl's own)", "", "```", *report["key_lines"], "```"]
    if report.get("triage"):
        lines += ["", "## rlbox triage", "", "```", report["triage"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Carrying it out.


def rlbox(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlbox.cli", *args], cwd=REPO, text=True, capture_output=True, **kw)


def present(image: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0


def step(title: str) -> None:
    print(f"== {title}", file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="verl_pt27_25rc3:ax-x86")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--no-kill", action="store_true", help="no node kill (and no resume check)")
    args = ap.parse_args()

    from rlbox.cli.common import matrix
    from rlbox.image import rehearsal, standins

    m = matrix()
    v = m.get(args.ref)
    base = f"localhost/rlbox-rehearsal/{v.release.image.name}:{v.tag}"
    OUT.mkdir(parents=True, exist_ok=True)
    commands: list[str] = []
    figures: dict = {}
    if not present(base):
        step(f"rlbox rehearse {args.ref} (no {base} yet)")
        cmd = ["rehearse", args.ref, *(["--ca-bundle", str(CA)] if CA.exists() else [])]
        commands.append("rlbox " + " ".join(cmd))
        proc = subprocess.run([sys.executable, "-m", "rlbox.cli", *cmd], cwd=REPO)
        if proc.returncode != 0:
            print(f"make rehearse-run: the rehearsal of {args.ref} failed (above)", file=sys.stderr)
            return proc.returncode
    built = REPO / "build" / "rehearsal" / f"{args.ref.replace(':', '-')}.json"
    if built.exists():
        timing = json.loads(built.read_text()).get("facts", {}).get("timing", {})
        figures["rehearsal build (s)"] = timing.get("build_s")
        figures["rehearsal checks (s)"] = timing.get("checks_s")
    figures["image size (bytes)"] = rehearsal.image_size(base)

    step(f"stand-in {STANDIN} on {base}")
    p = standins.plan(v, STANDIN, base)
    print(p.describe(), file=sys.stderr)
    commands.append(f"docker build --tag {p.tag} - < (stand-in layer above)")
    started = time.monotonic()
    standins.execute(p)
    figures["stand-in layer build (s)"] = round(time.monotonic() - started, 1)
    image = p.tag

    shared, runs = OUT / "shared", OUT / "runs"
    shutil.rmtree(runs / RUN, ignore_errors=True)
    if shared.exists():  # a fresh start: the job resumes only from this run's checkpoints
        subprocess.run(["docker", "run", "--rm", "--name", "rr-clean", "--network", "none", "--user", "0", "-v",
                        f"{shared}:/data", image, "rm", "-rf", "/data/checkpoints", "/data/models", "/data/datasets"],
                       capture_output=True)
    shared.mkdir(parents=True, exist_ok=True)
    runs.mkdir(parents=True, exist_ok=True)

    step("the tiny model (tools/make-tiny-model.py in the image)")
    commands.append(f"docker run {image} python3 tools/make-tiny-model.py /data/models/tiny-qwen2 "
                    "--corpus tests/fixtures/gsm8k-sample/train.jsonl")
    made = verl_cpu.make_model(image, shared)
    if made.returncode != 0:
        print(made.stdout[-2000:], made.stderr[-4000:], file=sys.stderr)
        return write(args, p, image, commands, figures, 1, made.stdout + made.stderr, [], None, "", "")

    step("the data (rlbox data prepare gsm8k, from the sample on a local HF-style server)")
    commands.append(f"rlbox data prepare gsm8k --image {image} --out {shared / 'datasets'} --endpoint URL")
    prepared = verl_cpu.make_data(image, shared, OUT / "hub")
    if prepared.returncode != 0:
        print(prepared.stdout[-2000:], prepared.stderr[-4000:], file=sys.stderr)
        return write(args, p, image, commands, figures, 1, prepared.stdout + prepared.stderr, [], None, "", "")

    step(f"rlbox run --sim --nodes 2 --recipe grpo-tiny-cpu ({args.steps} steps{'' if args.no_kill else ', node1 killed after step 2'})")
    run = ["run", "--sim", "--nodes", "2", "--image", image, "--recipe", "grpo-tiny-cpu", "--mount", f"{shared}:/data",
           "--name", RUN, "--runs-dir", str(runs), "--replace", "--no-doctor", "--timeout", "2400", "--devices", DEVICES,
           "--num-cpus", "4", "--max-restarts", "0" if args.no_kill else "1", "--param", f"steps={args.steps}"]
    commands.append("rlbox " + " ".join(run))
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "rlbox.cli", *run], cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    lines, killed = [], args.no_kill
    for line in proc.stdout:
        sys.stderr.write(line)
        lines.append(line)
        if not killed and re.search(r"(?<![\w/])step:2 - ", line):
            state = json.loads((runs / RUN / "state.json").read_text())
            node = state["nodes"][1]["container"]
            kill = ["docker", "kill", node]
            commands.append(" ".join(kill) + "   (after verl's step 2)")
            subprocess.run(kill, capture_output=True)
            figures["node killed at (s)"] = round(time.monotonic() - started, 1)
            killed = True
    code = proc.wait()
    lines = [ANSI.sub("", line) for line in lines]
    figures["job wall time (s)"] = round(time.monotonic() - started, 1)
    output = "".join(lines)

    steps, merge_code, merge_out, triage = [], None, "", ""
    met = rlbox("metrics", RUN, "--runs-dir", str(runs), "--json")
    commands.append(f"rlbox metrics {RUN} --runs-dir {runs} --json")
    if met.returncode == 0:
        records = json.loads(met.stdout).get("records", [])
        steps = sorted({r["step"] for r in records})
        figures["metrics per step"] = len(records[-1]) if records else 0
        figures["timing_s/step"] = [round(r.get("timing_s/step", float("nan")), 2) for r in records]
    figures["steps"] = steps
    if code == 0:
        merge = rlbox("merge", RUN, "--step", str(args.steps), "--runs-dir", str(runs))
        commands.append(f"rlbox merge {RUN} --step {args.steps} --runs-dir {runs}")
        merge_code, merge_out = merge.returncode, merge.stdout + merge.stderr
        sys.stderr.write(merge_out)
    else:
        tri = rlbox("triage", RUN, "--runs-dir", str(runs))
        commands.append(f"rlbox triage {RUN} --runs-dir {runs}")
        triage = tri.stdout + tri.stderr
        # the job's own log: the whole traceback (the run's output may show only its end)
        output += ANSI.sub("", "".join(log.read_text(errors="replace") for log in sorted((runs / RUN).glob("*.log"))))
    return write(args, p, image, commands, figures, code, output, steps, merge_code, merge_out, triage)


def write(args, p, image: str, commands: list[str], figures: dict, code, output: str, steps: list[int],
          merge_code, merge_out: str, triage: str = "") -> int:
    verdict = judge(code, output, steps, merge_code, merge_out, args.steps)
    if args.no_kill:
        verdict["checks"].pop("a node was lost and rlbox restarted")
        verdict["checks"].pop("verl resumed from its checkpoint")
        verdict["ok"] = all(verdict["checks"].values())
    figures["resumed from step"] = verdict["resumed_from"]
    figures["merge line"] = verdict["merge_line"]
    report = {"ref": args.ref, "image": image, "standin": p.as_dict(), "verdict": verdict, "figures": figures,
              "commands": commands, "key_lines": key_lines(output + "\n" + merge_out), "triage": triage}
    (OUT / "REPORT.json").write_text(json.dumps(report, indent=1) + "\n")
    (OUT / "REPORT.md").write_text(markdown(report))
    print(f"rehearse-run of {args.ref}: {'GREEN' if verdict['ok'] else 'RED'} (report: {OUT / 'REPORT.md'})")
    for name, good in verdict["checks"].items():
        print(f"  {'ok  ' if good else 'FAIL'} {name}")
    if verdict["failure"]:
        f = verdict["failure"]
        print(f"  what fails: {f['exception']}: {f['message']}\n    at {f['frame']}"
              + (f"\n    in verl at {f['verl_frame']}" if f.get("verl_frame") else ""))
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
