"""The `rlbox` command: the root group, the table of every command, and the one place errors
become a line on stderr and an exit code.

The root group is lazy: `rlbox --help` lists COMMANDS with their short help from the table
below without importing a single command module, and `rlbox X ...` imports only X's module.
Registering a command is one line in COMMANDS (tests/test_cli_lazy.py checks each line's
module, attribute and short help against the command itself)."""

from __future__ import annotations

import sys

import click

from rlbox import __version__
from rlbox.core.errors import RlboxError

# name -> (module under rlbox.cli, the click command's attribute there, its short help as
# `rlbox --help` lists it: the command's own first sentence, kept here so listing imports nothing).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "images": ("cmd_images", "images", "The version matrix (releases x hardware variants) and what a registry holds of it."),
    "inspect": ("cmd_images", "inspect_cmd", "Show what IMAGE holds: release, hardware, every pinned component and applied patch."),
    "diff": ("cmd_images", "diff_cmd", "What changed from IMAGE_A to IMAGE_B: image facts, components, patches, Python and OS packages."),
    "render": ("cmd_build", "render_cmd", "Render templates/ + images/ into dockerfiles/ (Dockerfile and image.json per variant) and the CI workflow."),
    "lock": ("cmd_build", "lock_cmd", "Resolve everything a build installs into images/lock/RELEASE.json."),
    "build": ("cmd_build", "build_cmd", "Build one variant of the matrix with BuildKit (docker buildx)."),
    "fetch-sources": ("cmd_build", "fetch_sources_cmd", "Fill .rlbox-sources/ with everything REF's build downloads, for `rlbox build REF --mirror offline`."),
    "rehearse": ("cmd_rehearse", "rehearse_cmd", "Build REF through its own rendered Dockerfile with the real pinned sources and the real locked files, "
                 "on a CANN stand-in base (tools/make-cann-standin.sh), offline from .rlbox-sources; then check the image: rlbox-verify "
                 "(installed set == lock, pip check), each git source's version, and every module each shipped recipe's entrypoint reaches."),
    "push": ("cmd_registry", "push_cmd", "Push a local image under its tag and an immutable TAG-<commit12> tag; print its digest."),
    "pull": ("cmd_registry", "pull_cmd", "Pull an image by tag or digest, or the variant for this host; refuse what does not fit."),
    "distribute": ("cmd_distribute", "distribute_cmd", "Deliver IMAGE to every node whose engine lacks it, then check every node by image id."),
    "run": ("cmd_run", "run_cmd", "Start the training container on every node, bring up Ray, run the job, tear down."),
    "validate": ("cmd_run", "validate_cmd", "Compose a verl job's Hydra config with the verl that will run and check it."),
    "doctor": ("cmd_run", "doctor_cmd", "Check every node before a run, in parallel: ✓ or ✗ with the fix."),
    "k8s": ("cmd_k8s", "k8s_group", "A run as Kubernetes objects (KubeRay RayJob)."),
    "status": ("cmd_runs", "status_cmd", "Show a run: its nodes' containers and the job's status."),
    "logs": ("cmd_runs", "logs_cmd", "Print the job's log (from the cluster while it runs, else the saved log file)."),
    "stop": ("cmd_runs", "stop_cmd", "Remove exactly this run's containers (by label) on every node, and its simulation network."),
    "metrics": ("cmd_metrics", "metrics_cmd", "Per-step training metrics of a run's verl job, read back from its log."),
    "triage": ("cmd_metrics", "triage_cmd", "Why a run's job failed: collect its logs and match known failure signatures."),
    "testbed": ("cmd_testbed", "testbed_group", "A cluster in a box: N hosts on this machine, each with its own network namespace and address on a bridge, its own Docker engine and sshd, and the NPU stand-ins of an Ascend host (/dev/davinci*, the driver's version.info, npu-smi)."),
    "recipes": ("cmd_recipes", "recipes", "verl runs shipped as data (the seeds' scripts, typos fixed, paths as parameters)."),
    "data": ("cmd_data", "data", "Training data the seeds use, prepared inside the training image."),
    "merge": ("cmd_data", "merge_cmd", "Merge RUN's FSDP actor shards of one step into a Hugging Face model, with verl's own `python -m verl.model_merger merge --backend fsdp`, inside the image."),
    "serve": ("cmd_serve", "serve_cmd", "Serve MODEL (a Hugging Face folder, e.g. from `rlbox merge`) with vLLM's OpenAI server on the NPUs, wait until it answers, print the endpoint."),
    "eval": ("cmd_serve", "eval_cmd", "Evaluate MODEL served at an OpenAI endpoint with AISBench, --repeat times, averaged."),
}


def load_command(name: str) -> click.Command:
    """The click command registered as ``name``: its module is imported here, on first use."""
    module, attr, _ = COMMANDS[name]
    __import__(f"rlbox.cli.{module}")  # an import statement's path: `python -X importtime` logs it
    return getattr(sys.modules[f"rlbox.cli.{module}"], attr)


class LazyGroup(click.Group):
    """A group whose commands come from COMMANDS, each module imported only when needed."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, cmd_name):
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def format_commands(self, ctx, formatter):
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(n, click.utils.make_default_short_help(COMMANDS[n][2], limit)) for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="rlbox")
def cli():
    """Reproducible verl images and launcher for Ascend NPU clusters.

    The version matrix lives in images/*.yaml; `rlbox render` turns it into dockerfiles/,
    `rlbox build` builds one variant with BuildKit, `rlbox inspect` reads an image's provenance.
    `rlbox run` launches verl across nodes; around it, `rlbox data prepare`, `rlbox merge`,
    `rlbox serve` and `rlbox eval` cover data, checkpoint merging, serving and AISBench.
    """


def fail(line: str) -> None:
    """One line on stderr: the text is data, never markup."""
    from rlbox.cli.common import err  # here: `rlbox --help` imports no more than the root group needs

    err.print(line, markup=False)


def main():
    try:
        cli.main(standalone_mode=False, prog_name="rlbox")
    except RlboxError as e:
        fail(f"rlbox: error: {e}")
        sys.exit(e.exit_code)
    except KeyboardInterrupt as e:  # before or after a run's own cleanup path: no traceback, no second one
        from rlbox.core import engine

        engine.ignore_interrupts()
        fail("rlbox: interrupted")
        sys.exit(engine.exit_code_of(e))
    except click.exceptions.Abort:
        fail("rlbox: aborted")
        sys.exit(130)
    except click.ClickException as e:  # usage errors too: the same one line as every other error
        message = " ".join(e.format_message().split())
        ctx = getattr(e, "ctx", None)
        if isinstance(e, click.UsageError) and ctx is not None:
            message += f" (see `{ctx.command_path} --help`)"
        fail(f"rlbox: error: {message}")
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
