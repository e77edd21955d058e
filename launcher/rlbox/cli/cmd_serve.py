"""`rlbox serve`, `rlbox eval`: the trained model behind vLLM's OpenAI server on the NPUs, and
AISBench against that server."""

from __future__ import annotations

from pathlib import Path

import click

from rlbox.cli.common import INT, NON_NEGATIVE, RUNS_DIR, SECONDS, IntRange, checked_name, image_ref, matrix, note, print_rows
from rlbox.core.errors import RlboxError
from rlbox.training import evaluate as ev
from rlbox.training import serve as serve_mod

SERVE_NAME = click.option("--name", default="serve", show_default=True, callback=checked_name,
                          help="Server name: its container is rlbox-serve-NAME, its record RUNS_DIR/serve/NAME.json.")


def _served_name(ctx, param, value):
    """One argument of vLLM's command line and the name clients ask for: never an option or two words."""
    if value is not None and (not value.isprintable() or any(c.isspace() for c in value) or value.startswith("-")
                              or not 0 < len(value) <= 256):
        raise RlboxError(f"--served-model-name {value[:60]!r}: one word of printable text, not starting with '-'")
    return value


@click.command("serve")
@click.argument("model", required=False)
@click.option("--tp", type=INT, default=8, show_default=True, help="--tensor-parallel-size (as the training's rollout TP).")
@click.option("--dp", type=INT, default=1, show_default=True, help="--data-parallel-size.")
@click.option("--max-model-len", type=INT, default=22528, show_default=True, help="--max-model-len (and --max-num-batched-tokens).")
@click.option("--port", type=IntRange(1, 65535), default=6380, show_default=True, help="--port of the OpenAI server.")
@click.option("--served-model-name", default="auto", show_default=True, callback=_served_name, help="Model name the server answers to (seed 000: auto).")
@click.option("--image", envvar="RLBOX_IMAGE", help="Image with vLLM + vllm-ascend: RELEASE:VARIANT or a reference (default for --sim: rlbox_sim).")
@click.option("--hosts", help="The host to serve on (one; default: this machine).")
@click.option("--cluster", type=click.Path(path_type=Path, dir_okay=False), help="Serve on a host of this cluster file "
              "(its ssh settings): the --node'th, the head by default.")
@click.option("--node", type=IntRange(0, 4095), default=0, show_default=True, help="With --cluster: which node (0 = the head).")
@click.option("--gpu-memory-utilization", "memory_fraction", type=click.FloatRange(0, 1, min_open=True), default=0.9,
              show_default=True, help="--gpu-memory-utilization (seed 000: 0.9; on vLLM's CPU build the fraction of the "
              "host's memory the server reserves).")
@click.option("--sim", is_flag=True, help="A simulated node on the local engine running rlbox's stub OpenAI server instead of vLLM.")
@click.option("--hardware", type=click.Choice(["a2", "a3", "ax"]), default="a3", show_default=True, help="Simulated hardware (--sim).")
@click.option("--mount", "mounts", multiple=True, metavar="SRC[:DST][:ro]", help="Extra mount (MODEL itself is mounted read-only).")
@click.option("--env", "envs", multiple=True, metavar="KEY=VALUE", help="Extra environment for the server.")
@SERVE_NAME
@click.option("--timeout", type=SECONDS, default=1800, show_default=True, help="Seconds to wait for /health and /v1/models.")
@click.option("--stop", is_flag=True, help="Stop the server of this --name instead (removes its container).")
@RUNS_DIR
@click.option("--dry-run", is_flag=True, help="Print the docker run and the server command; start nothing.")
def serve_cmd(model, tp, dp, max_model_len, port, served_model_name, image, hosts, cluster, node, memory_fraction, sim,
              hardware, mounts, envs, name, timeout, stop, runs_dir, dry_run):
    """Serve MODEL (a Hugging Face folder, e.g. from `rlbox merge`) with vLLM's OpenAI server on
    the NPUs, wait until it answers, print the endpoint. `rlbox serve --stop` ends it.

    \b
    rlbox serve /data/qwen3-32b-after-rl --image verl_pt27_25rc3:a3-arm --tp 8
    rlbox serve /data/qwen3-32b-after-rl --cluster cluster.yaml --image IMAGE   # on the cluster's head
    rlbox serve /data/qwen3-32b-after-rl --sim          # stub server on a simulated node
    rlbox serve --stop                                  # its log is kept: RUNS_DIR/serve/NAME.log
    """
    if stop:
        removed, host, log = serve_mod.stop_named(runs_dir, name)
        click.echo(f"server {name}: removed {removed} container(s) on {host}" + (f"; its log: {log}" if log else ""))
        return
    p = serve_mod.plan_request(matrix, model=model, hosts=hosts, cluster=cluster, node=node,
                               memory_fraction=memory_fraction, sim=sim, image=image, image_ref=image_ref,
                               hardware=hardware, tp=tp, dp=dp, max_model_len=max_model_len, port=port,
                               served_model_name=served_model_name, name=name, runs_dir=runs_dir, mounts=list(mounts),
                               envs=list(envs), dry_run=dry_run)
    if dry_run:
        click.echo(p.describe(), nl=False)
        return
    url = serve_mod.serve(p, timeout=timeout, echo=note, runs_dir=runs_dir, hardware=hardware)
    note(f"serving {p.model} as '{served_model_name}'" + (" (SIMULATED: rlbox's stub server, no vLLM)" if sim else "")
         + f"; stop with `rlbox serve --stop --name {name}`")
    click.echo(url)


@click.command("eval")
@click.argument("model", required=False)
@click.option("--dataset", default="aime2024", show_default=True, help="aime2024, math500, gsm8k, or an AISBench dataset config (..._gen...).")
@click.option("--repeat", type=INT, default=16, show_default=True, help="AISBench runs to average (seed 000: 16).")
@click.option("--endpoint", help="The server: http://HOST:PORT (default: the one `rlbox serve --name NAME` started).")
@click.option("--name", default="serve", show_default=True, callback=checked_name, help="Without --endpoint: the server `rlbox serve --name NAME` started.")
@click.option("--max-seq-len", type=INT, help="AISBench max_seq_len (default 2048).")
@click.option("--max-out-len", type=INT, help="AISBench max_out_len (default: the server's max-model-len - max_seq_len = 20480).")
@click.option("--batch-size", type=INT, default=48, show_default=True, help="AISBench batch_size (concurrent requests).")
@click.option("--temperature", type=NON_NEGATIVE, default=0.5, show_default=True, help="generation_kwargs temperature (seed: 0.5, top_k 10, top_p 0.95, repetition_penalty 1.03).")
@click.option("--ais-bench", "ais_bench", envvar="RLBOX_AIS_BENCH", help="The ais_bench command (default: ais_bench on PATH; env RLBOX_AIS_BENCH).")
@click.option("--ais-datasets", type=click.Path(path_type=Path, file_okay=False),
              help="AISBench's dataset folder (AIS_BENCH_DATASETS_CACHE), laid out as its loaders read it: ais_bench/datasets/gsm8k/{train,test}.jsonl, ais_bench/datasets/aime/aime.jsonl.")
@click.option("--out", "out", type=click.Path(path_type=Path, dir_okay=False), help="Result JSON (default: RUNS_DIR/eval/<model>-<dataset>-<time>.json).")
@click.option("--compare", "compare_files", nargs=2, type=click.Path(path_type=Path, dir_okay=False),
              metavar="BEFORE.json AFTER.json", help="Print the before/after table of two results and the gain; run nothing.")
@RUNS_DIR
def eval_cmd(model, dataset, repeat, endpoint, name, max_seq_len, max_out_len, batch_size, temperature, ais_bench,
             ais_datasets, out, compare_files, runs_dir):
    """Evaluate MODEL served at an OpenAI endpoint with AISBench, --repeat times, averaged.

    \b
    rlbox eval /data/qwen3-32b --dataset aime2024 --repeat 16     # the server of `rlbox serve`
    rlbox eval after-rl --endpoint http://10.0.0.1:6380 --repeat 16 --out after.json
    rlbox eval tiny --dataset gsm8k --ais-datasets DIR --ais-bench .venv-aisbench/bin/ais_bench --endpoint http://127.0.0.1:8000
    rlbox eval --compare before.json after.json
    """
    if compare_files:
        print_rows(ev.compare(ev.load_result(compare_files[0]), ev.load_result(compare_files[1])))
        return
    if not model:
        raise RlboxError("eval: give MODEL (a label for the results: the model's path or name), or --compare A B")
    ep = ev.endpoint_for(endpoint, runs_dir, name)
    p = ev.plan(model=model, dataset=dataset, endpoint=ep, repeat=repeat, executable=ais_bench, out_dir=runs_dir,
                max_seq_len=max_seq_len, max_out_len=max_out_len, batch_size=batch_size,
                generation=dict(ev.GENERATION, temperature=temperature),
                datasets_cache=ais_datasets.resolve() if ais_datasets else None)
    path = out or (runs_dir / "eval" / f"{p.work.name}.json")
    res = ev.evaluate(p, note, path)
    print_rows([["dataset", "version", "metric", "mode", ev.MODEL_ABBR],
                [res["dataset"], res["version"], res["metric"], res["mode"], f"{res['mean']:.2f}"]])
    note(f"mean of {repeat} run(s): {', '.join(f'{r.value:.2f}' for r in p.runs)}; saved {path}")

