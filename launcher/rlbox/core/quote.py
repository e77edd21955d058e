"""Values quoted for where they go: one function per target a value taken from input (a manifest,
a lock, the command line) is written into. Each one either returns text that the target reads as
exactly that one value, or refuses the value with ValueError saying why: no value can add a
Dockerfile instruction, a shell word, a pip option line, a buildx attribute, a Makefile
assignment, a Hydra sweep or list, or an invalid Kubernetes key.

Callers turn ValueError into their one-line error (schemas do it by raising it from validators;
the Jinja ``q``/``word``/``envkey`` filters of ``rlbox.image.render`` raise it through Jinja).
"""

from __future__ import annotations

import json
import re
import shlex
import string

from rlbox.core.config import control_char


def _one_line(value: str, target: str) -> str:
    bad = control_char(value)
    if bad is not None:
        raise ValueError(f"{value[:60]!r}: control character U+{ord(bad):04X} cannot go into {target}")
    return value


# -- shell and Dockerfile -----------------------------------------------------------------------

def shell(value: object) -> str:
    """One word of a shell line (``sh -c``); control characters are refused (a newline inside
    quotes is still a new line of a Dockerfile or a log)."""
    return shlex.quote(_one_line(str(value), "a shell line"))


def dockerfile_shell(value: object) -> str:
    """One word of a shell-form Dockerfile instruction (``RUN``, ``ENV k=v``, ``LABEL k=v``): quoted
    for the shell BuildKit runs; a newline (a new instruction) or any control character refused."""
    return shell(_one_line(str(value), "a Dockerfile"))


def dockerfile_json(values: list[object]) -> str:
    """The JSON (exec) form of a Dockerfile instruction: ``["a", "b"]``, one line."""
    return json.dumps([_one_line(str(v), "a Dockerfile") for v in values], ensure_ascii=True)


_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+:@/=~-]*")


def word(value: object, what: str = "value") -> str:
    """A token that needs no quoting anywhere (package names, hex digests, versions, names): refused
    unless it is letters, digits and ``. _ + : @ / = ~ -`` and starts with a letter or digit."""
    text = str(value)
    if not _WORD.fullmatch(text):
        raise ValueError(f"{what} {text[:60]!r} is not a plain word (letters, digits, . _ + : @ / = ~ -, "
                         "starting with a letter or digit)")
    return text


ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_key(value: object) -> str:
    """An environment variable name (shell, Dockerfile ENV, Kubernetes env): ``[A-Za-z_][A-Za-z0-9_]*``."""
    text = str(value)
    if not ENV_KEY.fullmatch(text):
        raise ValueError(f"{text[:60]!r} is not an environment variable name (letters, digits, '_'; "
                         "not starting with a digit)")
    return text


# -- pip, buildx, make ----------------------------------------------------------------------------

def requirement_part(value: object, what: str = "requirement") -> str:
    """A value written into a pip requirements file (a name, version, hash or URL): one line, no
    whitespace (pip splits options on it), never starting with ``-`` (``--index-url``, ``-e``,
    ``-r`` would be read as an option) and no `` #`` comment."""
    text = _one_line(str(value), "a requirements file")
    if not text or text.startswith("-") or any(c.isspace() for c in text) or "\\" in text:
        raise ValueError(f"{what} {text[:60]!r} cannot go into a requirements file (empty, starts with '-', "
                         "or holds whitespace or a backslash)")
    return text


def buildx_value(value: object, what: str = "value") -> str:
    """A value of a buildx ``--output``/``--cache-to`` attribute (``type=image,name=VALUE``): a ``,``
    would add an attribute, a ``=`` or quote would change one; refused."""
    text = _one_line(str(value), "a buildx option")
    bad = next((c for c in text if c in ',="\'' or c.isspace()), None)
    if bad is not None or not text:
        raise ValueError(f"{what} {text[:60]!r}: {bad!r} cannot go into a buildx option value")
    return text


def make_value(value: object, what: str = "value") -> str:
    """A Makefile variable's value (``make image REF=VALUE``, expanded unquoted into a recipe's shell
    line): refused when make or that shell would read more than a word (``$`` expansion, ``;``
    and ``&``/``|`` commands, ``#`` comments, ``=`` assignments, whitespace, quotes, globs)."""
    text = _one_line(str(value), "a Makefile")
    bad = next((c for c in text if c in "$;#=\\'\"`|&<>(){}*?[]!" or c.isspace()), None)
    if bad is not None or not text:
        raise ValueError(f"{what} {text[:60]!r}: {bad!r} cannot go into a Makefile")
    return text


# -- Hydra ------------------------------------------------------------------------------------------

# Hydra's override grammar (hydra/grammars/OverrideLexer.g4, 1.1+): an unquoted value is a sweep
# when it holds `,`, a list or dict when it starts with `[`/`{`, a function call with `(`; `=`, `:`,
# whitespace and `\` are special too. A quoted value ('...') is one string: inside it only `'` and
# the backslashes before it are escaped. `${...}` interpolations are kept (users use them).
_HYDRA_PLAIN = re.compile(r"[A-Za-z0-9_/.+\-@%^]*(?:\$\{[^{}]*\}[A-Za-z0-9_/.+\-@%^]*)*")
# The lexer's INT, FLOAT, BOOL and NULL tokens: a plain value spelling one is not read as a string.
_DIGITS = r"[0-9](?:_?[0-9])*"
_POINT_FLOAT = rf"(?:{_DIGITS})?\.{_DIGITS}|{_DIGITS}\."
HYDRA_NOT_STRING = re.compile(
    rf"[+-]?(?:0|[1-9](?:_?[0-9])*)"  # INT
    rf"|[+-]?(?:{_POINT_FLOAT}|(?:{_DIGITS}|{_POINT_FLOAT})[eE][+-]?{_DIGITS}|[Ii][Nn][Ff]|[Nn][Aa][Nn])"  # FLOAT
    r"|[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]|[Nn][Uu][Ll][Ll]")  # BOOL, NULL


def hydra_value(value: object, string: bool = False) -> str:
    """A Hydra override value that Hydra parses as exactly this one string (or, unless ``string``,
    the number/bool/null it spells): plain when that is safe, else single-quoted with ``\\'`` escaped.
    ``string``: a value that must stay a string (a path, a name) is quoted when it spells a number,
    a bool or null (``null``, ``1e3``, ``True`` would not reach verl as text)."""
    text = _one_line(str(value), "a Hydra override")
    if text and _HYDRA_PLAIN.fullmatch(text) and not (string and HYDRA_NOT_STRING.fullmatch(text)):
        return text
    # escape backslashes that precede a quote or the end, then the quotes themselves
    out = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, text)
    return "'" + out.replace("'", "\\'") + "'"


# A Hydra override's key (its lexer's key: dotted IDs, an optional @package), and one whole
# override ``[+|++|~]KEY=VALUE`` whose value Hydra reads as one element (never a sweep).
HYDRA_KEY = re.compile(r"[A-Za-z_$][A-Za-z0-9_$\-]*(?:[./][A-Za-z0-9_$][A-Za-z0-9_$\-]*)*(?:@[A-Za-z0-9_$.]+)?")


def hydra_key(value: object, add: bool = False) -> str:
    """A config key (``a.b.c``); with ``add``, a leading ``+`` (add the key) is taken too. No space,
    ``=`` or quote: a key is one key, never a key and a value."""
    text = _one_line(str(value), "a Hydra key")
    if len(text) > 256 or not HYDRA_KEY.fullmatch(text.removeprefix("+") if add else text):
        raise ValueError(f"{text[:60]!r} is not a config key (dotted names of letters, digits, '_' and '-'"
                         + (", a leading '+' to add it" if add else "") + ")")
    return text


def hydra_override(value: object) -> str:
    """One Hydra override ``[+|++|~]KEY=VALUE`` (``~KEY`` deletes): one line, a config key, and a value
    Hydra's own override parser reads as one element (a sweep ``a,b`` or a parse error refused)."""
    text = _one_line(str(value), "a Hydra override")
    key, eq, _ = text.partition("=")
    prefix = next((p for p in ("++", "+", "~") if key.startswith(p)), "")
    if not HYDRA_KEY.fullmatch(key[len(prefix):]) or (not eq and prefix != "~"):
        raise ValueError(f"{text[:60]!r} is not one KEY=VALUE override (a config key, '=', a value; "
                         "'+' adds a key, '~KEY' deletes one)")
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        override = OverridesParser.create().parse_override(text)
    except HydraException as err:
        raise ValueError(f"{text[:60]!r} is not a Hydra override: {str(err).splitlines()[0][:100]}") from None
    if override.is_sweep_override():
        raise ValueError(f"{text[:60]!r} is a sweep (several values); an override here sets one value: "
                         "quote a value that holds ','")
    return text


# -- format strings ---------------------------------------------------------------------------------

def format_fields(template: str, allowed: tuple[str, ...], what: str) -> str:
    """A ``str.format`` template that only names ``allowed`` fields, with no attribute or index
    access (``{x.__class__}``, ``{x[0]}``), conversion or format spec (``{x:>400000000}``); else
    ValueError naming the first bad field."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"{what} {template[:60]!r}: {err}") from None
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        if field not in allowed:
            raise ValueError(f"{what} {template[:60]!r}: unknown field {{{field[:40]}}}; use "
                             + ", ".join(f"{{{a}}}" for a in allowed))
        if spec or conversion:
            raise ValueError(f"{what} {template[:60]!r}: {{{field}}} takes no format spec or conversion")
    return template
