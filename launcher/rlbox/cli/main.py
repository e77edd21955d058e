"""The `rlbox` command: the root group, every command module's commands on it, and the one
place errors become a line on stderr and an exit code."""

from __future__ import annotations

import sys

import click

from rlbox import __version__
from rlbox.cli import (cmd_build, cmd_data, cmd_distribute, cmd_images, cmd_k8s, cmd_metrics, cmd_recipes, cmd_registry, cmd_rehearse, cmd_run,
                       cmd_runs, cmd_serve, cmd_testbed)
from rlbox.cli.common import err
from rlbox.core.errors import RlboxError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="rlbox")
def cli():
    """Reproducible verl images and launcher for Ascend NPU clusters.

    The version matrix lives in images/*.yaml; `rlbox render` turns it into dockerfiles/,
    `rlbox build` builds one variant with BuildKit, `rlbox inspect` reads an image's provenance.
    `rlbox run` launches verl across nodes; around it, `rlbox data prepare`, `rlbox merge`,
    `rlbox serve` and `rlbox eval` cover data, checkpoint merging, serving and AISBench.
    """


for module in (cmd_images, cmd_build, cmd_rehearse, cmd_registry, cmd_run, cmd_distribute, cmd_k8s, cmd_runs, cmd_metrics, cmd_recipes, cmd_data, cmd_serve, cmd_testbed):
    for command in module.COMMANDS:
        cli.add_command(command)


def main():
    try:
        cli.main(standalone_mode=False, prog_name="rlbox")
    except RlboxError as e:
        err.print(f"rlbox: error: {e}", markup=False)
        sys.exit(e.exit_code)
    except KeyboardInterrupt as e:  # before or after a run's own cleanup path: no traceback, no second one
        from rlbox.core import engine

        engine.ignore_interrupts()
        err.print("rlbox: interrupted")
        sys.exit(engine.exit_code_of(e))
    except click.exceptions.Abort:
        err.print("rlbox: aborted")
        sys.exit(130)
    except click.ClickException as e:  # usage errors too: the same one line as every other error
        message = " ".join(e.format_message().split())
        ctx = getattr(e, "ctx", None)
        if isinstance(e, click.UsageError) and ctx is not None:
            message += f" (see `{ctx.command_path} --help`)"
        err.print(f"rlbox: error: {message}", markup=False)
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
