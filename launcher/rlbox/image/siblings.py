"""Sibling variants: two variants of one release on one platform (A2 and A3 of an arm64 release) that
are the same image but for their hardware. When they are, the rehearsal of one stands for the other.

``compare`` renders both (render.py: Dockerfile, image.json, both requirement locks) and goes through
the lines that differ. A differing pair of lines is explained when, with each variant's own spelling of
its named fields replaced by one marker (the variant, the base image, the SoC version, the chip,
the hardware, NPUs per node, the lock's digest), the two lines are the same; any other difference (a
package pin, a step, an environment value, a line only one of them has) is unexplained, and so is a
line both have that holds one variant's own hardware value (A2 built for A3's SoC): then the two are
not siblings. Pure: the matrix in, a printable value out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlbox.image import render
from rlbox.image.matrix import ResolvedVariant


MARK = "\x00hw\x00"  # no rendered file holds a NUL
DISTINCT = ("SoC version", "base image", "image", "variant")


def spellings(v: ResolvedVariant) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The variant's named fields, each with the ways the rendered files spell it; the longer
    spellings first, so that a part of one (the chip inside the base image's tag) is never taken
    for the whole."""
    hw = v.hardware
    return (
        ("lock digest", tuple(d for d in (v.lock.digest(),) if d)),
        ("base image", (v.locked_base_image, v.base_image)),
        ("image", (v.image,)),
        ("variant", (v.name, v.tag)),
        ("SoC version", (hw.soc_version, hw.soc_version.upper())),
        ("npu-smi chip", (hw.npu_smi_chip,)),
        ("hardware description", (hw.description,)),
        ("hardware", (v.hardware_name,)),
        ("chip", (hw.chip,)),
        ("NPUs per node", (str(hw.npus_per_node),)),
    )


def _named(line: str, fields) -> tuple[str, frozenset[str]]:
    """``line`` with every spelling of a named field replaced by one marker (whole words only: one
    variant's chip may be spelt as the other's hardware, A3's chip and hardware are both ``a3``);
    the fields it held."""
    held = set()
    for name, values in fields:
        for value in sorted(set(values), key=len, reverse=True):
            pattern = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(value) + r"(?![A-Za-z0-9_])")
            line, n = pattern.subn(MARK, line)
            if n:
                held.add(name)
    return line, frozenset(held)


@dataclass(frozen=True)
class Siblings:
    release: str
    a: str
    b: str
    files: int
    fields: tuple[str, ...]  # the named fields that differ
    unexplained: tuple[str, ...]  # "FILE line N: A-LINE | B-LINE", or a file only one has

    @property
    def same_but_for_hardware(self) -> bool:
        return not self.unexplained

    def describe(self) -> str:
        head = f"{self.release}: {self.a} vs {self.b}, {self.files} rendered files"
        if self.same_but_for_hardware:
            return f"{head}: the same image but for {', '.join(self.fields) or 'nothing'}"
        return head + f": {len(self.unexplained)} difference(s) no named field explains:\n" + \
            "\n".join(f"  {u}" for u in self.unexplained)

    def as_dict(self) -> dict:
        return {"release": self.release, "a": self.a, "b": self.b, "files": self.files, "fields": list(self.fields),
                "unexplained": list(self.unexplained), "same_but_for_hardware": self.same_but_for_hardware}


def compare_texts(release: str, a: ResolvedVariant, b: ResolvedVariant, texts_a: dict[str, str],
                  texts_b: dict[str, str]) -> Siblings:
    """The judgement over two variants' rendered files (by name)."""
    fa, fb = spellings(a), spellings(b)
    # the distinctive spellings only one of them has (the SoC, the base image, the image, the variant's
    # name; not the short ones, a chip "a3" or 16 NPUs, which any text may hold)
    only_a = tuple((k, tuple(x for x in va if x not in dict(fb)[k])) for k, va in fa if k in DISTINCT)
    only_b = tuple((k, tuple(x for x in vb if x not in dict(fa)[k])) for k, vb in fb if k in DISTINCT)
    fields: set[str] = set()
    unexplained: list[str] = []
    for name in sorted(set(texts_a) | set(texts_b)):
        if name not in texts_a or name not in texts_b:
            unexplained.append(f"{name}: only {a.name if name in texts_a else b.name} has it")
            continue
        la, lb = texts_a[name].splitlines(), texts_b[name].splitlines()
        if len(la) != len(lb):
            unexplained.append(f"{name}: {len(la)} lines in {a.name}, {len(lb)} in {b.name}")
            continue
        for n, (x, y) in enumerate(zip(la, lb), 1):
            if x == y:
                if _named(x, only_b)[1]:  # the same line, but it is B's hardware in A (A2 built for A3's SoC)
                    unexplained.append(f"{name} line {n}: {a.name} has {b.name}'s "
                                       f"{', '.join(sorted(_named(x, only_b)[1]))}: {x.strip()[:120]}")
                elif _named(x, only_a)[1]:
                    unexplained.append(f"{name} line {n}: {b.name} has {a.name}'s "
                                       f"{', '.join(sorted(_named(x, only_a)[1]))}: {x.strip()[:120]}")
                continue
            nx, held_x = _named(x, fa)
            ny, held_y = _named(y, fb)
            if nx == ny:
                fields |= held_x | held_y
            else:
                unexplained.append(f"{name} line {n}: {x.strip()[:120]} | {y.strip()[:120]}")
    order = [name for name, _ in fa]
    return Siblings(release, a.name, b.name, len(set(texts_a) | set(texts_b)),
                    tuple(sorted(fields, key=order.index)), tuple(unexplained))


def compare(a: ResolvedVariant, b: ResolvedVariant) -> Siblings:
    """Two variants of one release, rendered and judged."""
    env = render.environment(a.root)
    return compare_texts(a.release.release, a, b, render.variant_files(a, env), render.variant_files(b, env))


def pairs(variants) -> list[tuple[ResolvedVariant, ResolvedVariant]]:
    """Per release and platform, its A2 variant with its A3 one (the hardware pairs rehearsals cover
    one of)."""
    out = []
    by = {}
    for v in variants:
        by.setdefault((v.release.release, v.platform), {})[v.hardware_name] = v
    for (_, _), hw in sorted(by.items()):
        if "a2" in hw and "a3" in hw:
            out.append((hw["a2"], hw["a3"]))
    return out
