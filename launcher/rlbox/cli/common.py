"""What every command module shares: the two consoles, one-line notes, the matrix of the tree
being worked on, and options several commands take. No command logic lives here."""

from __future__ import annotations

import os
from pathlib import Path

from typing import TYPE_CHECKING

import click

from rlbox.core import names
from rlbox.core.errors import RlboxError
from rlbox.core.paths import find_root

if TYPE_CHECKING:  # imported where used: `rlbox --help` and quick commands load neither
    from rlbox.image import matrix as matrix_mod
    from rlbox.image import mirrors


class LazyConsole:
    """A rich Console made on first use, so that importing a command module does not import rich.

    User text (image names, hosts, labels, errors) is data: never rich markup (`[x]`) or emoji
    codes (`:x:`), so neither console interprets either; styled output passes rich Text."""

    def __init__(self, stderr: bool):
        self.stderr = stderr
        self.console = None

    def __getattr__(self, name):
        if self.console is None:
            from rich.console import Console

            options = dict(stderr=self.stderr, highlight=False, soft_wrap=True, markup=False, emoji=False)
            self.console = Console(**options)
            if not self.stderr and not self.console.is_terminal:  # piped: never truncate table cells
                self.console = Console(width=400, **options)
        return getattr(self.console, name)


out = LazyConsole(stderr=False)
err = LazyConsole(stderr=True)


def note(line: str) -> None:
    """One line on stderr, prefixed ``rlbox:``; the text is data, never markup."""
    err.print(f"rlbox: {line}", markup=False, highlight=False)


def matrix() -> matrix_mod.Matrix:
    from rlbox.image import matrix as matrix_mod

    return matrix_mod.load(find_root())


def matrix_if_any() -> matrix_mod.Matrix | None:
    """The matrix when there is an rlbox tree (commands that also take plain image names)."""
    if os.environ.get("RLBOX_ROOT"):
        return matrix()
    try:
        root = find_root()
    except RlboxError:
        return None
    from rlbox.image import matrix as matrix_mod

    return matrix_mod.load(root)


def mirror_profile(m: matrix_mod.Matrix | None, name: str | None) -> mirrors.Profile | None:
    """``--mirror NAME`` of the tree's images/mirrors.yaml (None without the option)."""
    if name is None:
        return None
    if m is None:
        raise RlboxError(f"--mirror {name} needs images/mirrors.yaml (an rlbox tree or RLBOX_ROOT)")
    from rlbox.image import mirrors

    return mirrors.get(m.root, name)


def image_ref(ref: str | None, what: str) -> str:
    """An image reference from RELEASE:VARIANT of the matrix or a full reference."""
    if not ref:
        raise RlboxError(f"{what}: give --image RELEASE:VARIANT (rlbox images list) or an image reference "
                         "(or set RLBOX_IMAGE): the work runs inside the training image")
    from rlbox.registry.reference import Reference

    try:  # parsed before any engine sees it
        Reference.parse(ref)
    except RlboxError as err:
        raise RlboxError(f"{what}: --image: {err}") from None
    image, _ = matrix().image_for(ref)
    return image


def checked_image(ctx, param, value, *, kind: str = "reference"):
    """Click callback: an image argument or option (or each of a repeated one) parsed as a reference
    (rlbox.registry.reference, the distribution spec's grammar) before any engine call. ``kind``
    ``tag``: NAME[:TAG], no digest (what an image is tagged as); ``name``: a repository, no tag or digest."""
    if value is None:
        return value
    from rlbox.registry.reference import Reference

    what = param.opts[-1] if isinstance(param, click.Option) and param.opts else param.human_readable_name
    for text in value if isinstance(value, tuple) else (value,):
        try:
            ref = Reference.parse_name(text) if kind == "name" else Reference.parse(text)
        except RlboxError as err:
            raise RlboxError(f"{what}: {err}") from None
        if kind == "tag" and ref.digest:
            raise RlboxError(f"{what}: {text[:120]}: an image is tagged NAME[:TAG], without a digest")
    return value


def checked_image_tag(ctx, param, value):
    return checked_image(ctx, param, value, kind="tag")


def checked_repository(ctx, param, value):
    return checked_image(ctx, param, value, kind="name")


def checked_url(ctx, param, value):
    """Click callback: a URL option (index, mirror, endpoint) by the one URL rule of rlbox.core.config."""
    if value is None:
        return value
    from rlbox.core.config import check_url

    return check_url(value, param.opts[-1])


class _Finite(click.FloatRange):
    """A bounded number that is a finite number: ``nan`` passes every comparison and ``inf`` an open
    bound, so both are refused here."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if rv != rv or rv in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


SECONDS = _Finite(0, 86400, min_open=True)  # timeouts: more than 0 s, at most a day
NON_NEGATIVE = _Finite(0)  # a number: finite, not below 0 (a temperature)


def _ascii_digits(kind, value, param, ctx) -> None:
    """Python's int() reads any Unicode digit (``４``, ``٣``): an option's number is ASCII digits."""
    if isinstance(value, str) and not (value.strip().lstrip("+-").isascii() and value.strip().lstrip("+-").isdigit()):
        kind.fail(f"{value!r} is not a whole number (ASCII digits 0-9)", param, ctx)


class Integer(click.types.IntParamType):
    """Every integer option's type (``type=INT``): ASCII digits only."""

    def convert(self, value, param, ctx):
        _ascii_digits(self, value, param, ctx)
        return super().convert(value, param, ctx)


class IntRange(click.IntRange):
    """Every bounded integer option's type: click's IntRange, ASCII digits only."""

    def convert(self, value, param, ctx):
        _ascii_digits(self, value, param, ctx)
        return super().convert(value, param, ctx)


INT = Integer()
INT32 = 2**31 - 1  # what a Kubernetes int32 field (activeDeadlineSeconds) holds
MAX_RESTARTS = 10_000  # --max-restarts: what a run's record holds (and within a RayJob's int32 backoffLimit)


def table_of(*headers: str):
    """A rich Table without borders (rich is imported here, when a command prints one)."""
    from rich.table import Table

    return Table(*headers, box=None)


def print_rows(rows: list[list[str]]) -> None:
    """A table in markdown form (| a | b |), the first row its header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

    click.echo(line(rows[0]))
    click.echo("| " + " | ".join("-" * w for w in widths) + " |")
    for r in rows[1:]:
        click.echo(line(r))


REGISTRY = click.option("--registry", "registry_host", metavar="HOST[:PORT]",
                        help="Registry host to use instead of the one in the name or the release's "
                             "image.registry; the repository path is kept.")
MIRROR = click.option("--mirror", "mirror", metavar="PROFILE",
                      help="Mirror profile from images/mirrors.yaml whose registry to use (cn: SWR, intl: quay.io).")
INSECURE = click.option("--insecure", is_flag=True,
                        help="rlbox's own registry requests over plain http (loopback registries always are); "
                             "the engine's push/pull needs the registry in its insecure-registries as well.")
RUNS_DIR = click.option("--runs-dir", type=click.Path(path_type=Path), default=Path("runs"), show_default=True,
                        envvar="RLBOX_RUNS_DIR", help="Where run state and job logs are kept.")
def checked_name(ctx, param, value):
    """Click callback: a run or server name by the one rule (rlbox.core.names), before anything
    reads or writes a path, a container or a network built from it."""
    if value is None:
        return value
    return names.check(value, param.opts[-1] if param.opts else param.human_readable_name)


NAME = click.option("--name", default="verl", show_default=True, callback=checked_name,
                    help="Run name (lower-case letters, digits, '-'; at most 41): labels every container of the run.")
