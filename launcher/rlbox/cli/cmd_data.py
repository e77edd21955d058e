"""`rlbox data list|prepare`, `rlbox merge`: training data before a run, a Hugging Face model
from its checkpoints after it; both run inside the training image."""

from __future__ import annotations

from pathlib import Path

import click

from rlbox.cli.common import INT32, RUNS_DIR, IntRange, image_ref, note, out, table_of
from rlbox.cluster import state as run_state
from rlbox.core import engine
from rlbox.training import datasets
from rlbox.training import merge as merge_mod


@click.group()
def data():
    """Training data the seeds use, prepared inside the training image."""


@data.command("list")
def data_list():
    """List the datasets `rlbox data prepare` knows (launcher/rlbox/resources/datasets.yaml)."""
    table = table_of("DATASET", "FILES", "KIND", "DESCRIPTION")
    for name, d in datasets.recipes().items():
        files = ", ".join(f.save for f in d.files) or "--spec FILE"
        table.add_row(name, files, d.transform or "download", d.description)
    out.print(table)


@data.command("prepare")
@click.argument("name")
@click.option("--image", envvar="RLBOX_IMAGE", help="Training image to run in: RELEASE:VARIANT or a reference (env RLBOX_IMAGE).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=Path("datasets"),
              show_default=True, help="Folder the parquet files go to (mounted into the container at the same path).")
@click.option("--endpoint", envvar="HF_ENDPOINT", default="hf", show_default=True,
              help="hf, hf-mirror, modelscope, or an HF-compatible base URL (env HF_ENDPOINT).")
@click.option("--spec", "spec", type=click.Path(path_type=Path, dir_okay=False),
              help="custom only: YAML field mapping (input, prompt, answer, ground_truth, data_source, ability).")
@click.option("--overwrite", is_flag=True, help="Download and write again files that are already there.")
@click.option("--dry-run", is_flag=True, help="Print the recipe, every URL and output, and the docker run; do nothing.")
def data_prepare(name, image, out_dir, endpoint, spec, overwrite, dry_run):
    """Download and convert dataset NAME into verl's parquet layout, inside the training image.

    \b
    rlbox data prepare dapo-math-17k --image verl_pt27_25rc3:a3-arm --out /data/datasets
    rlbox data prepare gsm8k --image IMAGE --endpoint hf-mirror --out /data/datasets
    rlbox data prepare custom --spec dianjin.yaml --image IMAGE --out /data/datasets/dianjin
    """
    p = datasets.plan(name, image=image_ref(image, f"data prepare {name}"), out=out_dir, endpoint=endpoint,
                      overwrite=overwrite, spec_path=spec)
    if dry_run:
        click.echo(p.describe(), nl=False)
        return
    said = datasets.execute(p, engine.local_client(), lambda line: click.echo(line))
    wrote = sum(1 for s in said if s.startswith(("wrote", "downloaded")))
    skipped = sum(1 for s in said if s.startswith("skip"))
    note(f"{name}: {wrote} file(s) written, {skipped} skipped, in {p.out}")


@click.command("merge")
@click.argument("run")
@click.option("--step", type=IntRange(0, INT32), required=True, help="The training step: global_step_N/actor of the run's checkpoints.")
@click.option("--target", help="Folder for the Hugging Face model, on the node holding rank 0 "
              "(default: CHECKPOINTS/global_step_N/hf_merged).")
@click.option("--image", help="Image with verl to merge in (default: the run's image).")
@click.option("--checkpoint-dir", help="Host folder holding global_step_* on every node, instead of the one "
              "the run's job and mounts say (trainer.default_local_dir).")
@RUNS_DIR
@click.option("--dry-run", is_flag=True, help="Print where the shards are looked for and the merge command; touch no host.")
def merge_cmd(run, step, target, image, checkpoint_dir, runs_dir, dry_run):
    """Merge RUN's FSDP actor shards of one step into a Hugging Face model, with verl's own
    `python -m verl.model_merger merge --backend fsdp`, inside the image.

    Shards spread over the nodes' local disks are first gathered onto the node holding rank 0;
    every rank 0..W-1 must be present.
    """
    state = run_state.load(runs_dir, run)
    p = merge_mod.plan(state.plan, run=run, step=step, image=image_ref(image, "merge") if image else None,
                       target=target, checkpoint_dir_override=checkpoint_dir)
    if dry_run:
        click.echo(p.describe(), nl=False)
        return
    where = merge_mod.execute(p, echo=note, emit=lambda line: click.echo(line))
    note(f"merged step {step} of run {run} into {where}")

