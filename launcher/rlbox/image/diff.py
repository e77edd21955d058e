"""What changed between two images, from what they record about themselves.

An image built by rlbox carries its resolved manifest (``/etc/rlbox/image.json``: components,
patches, lock) and its SBOM (``/etc/rlbox/sbom.json``: every Python and OS package), plus
``io.rlbox.*`` labels. ``compare`` is pure: two such records in, the differences out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Record:
    """What one image says about itself."""

    ref: str
    where: str  # "local" or "registry"
    labels: dict[str, str]
    manifest: dict[str, Any] | None
    sbom: dict[str, Any] | None
    digest: str | None = None


@dataclass
class Section:
    name: str
    added: dict[str, str] = field(default_factory=dict)
    removed: dict[str, str] = field(default_factory=dict)
    changed: dict[str, tuple[str, str]] = field(default_factory=dict)
    same: int = 0
    known: bool = True  # False when one side does not record this section

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "added": self.added,
            "removed": self.removed,
            "changed": {k: {"from": a, "to": b} for k, (a, b) in self.changed.items()},
            "unchanged": self.same,
            "recorded": self.known,
        }


def _section(name: str, a: dict[str, str] | None, b: dict[str, str] | None) -> Section:
    if a is None or b is None:
        return Section(name, known=False)
    sec = Section(name)
    for key in sorted(set(a) | set(b)):
        if key not in a:
            sec.added[key] = b[key]
        elif key not in b:
            sec.removed[key] = a[key]
        elif a[key] != b[key]:
            sec.changed[key] = (a[key], b[key])
        else:
            sec.same += 1
    return sec


def _facts(r: Record) -> dict[str, str]:
    m = r.manifest or {}
    lab = r.labels
    return {
        "release": m.get("ref") or lab.get("org.opencontainers.image.version", ""),
        "platform": m.get("platform") or lab.get("io.rlbox.platform", ""),
        "hardware": m.get("hardware") or lab.get("io.rlbox.hardware", ""),
        "base": m.get("base_image") or lab.get("org.opencontainers.image.base.name", ""),
        "base digest": m.get("base_digest") or lab.get("io.rlbox.base.digest", "") or "",
        "cann": m.get("cann") or lab.get("io.rlbox.cann", ""),
        "python": (r.sbom or {}).get("python") or m.get("python") or lab.get("io.rlbox.python", ""),
        "revision": lab.get("org.opencontainers.image.revision", ""),
        "lock": ((m.get("lock") or {}).get("digest")) or lab.get("io.rlbox.lock", "") or "",
    }


def _components(r: Record) -> dict[str, str]:
    if r.manifest and r.manifest.get("components"):
        return {name: c["pin"] for name, c in r.manifest["components"].items()}
    return {k.removeprefix("io.rlbox.component."): v for k, v in r.labels.items() if k.startswith("io.rlbox.component.")}


def _patches(r: Record) -> dict[str, str] | None:
    if r.manifest is not None:
        return {p["name"]: "sha256:" + p["sha256"] for p in r.manifest.get("patches", [])}
    label = r.labels.get("io.rlbox.patches")
    if label is None:
        return None
    return dict(item.split("@", 1) for item in label.split(",") if "@" in item)


def _packages(r: Record, key: str) -> dict[str, str] | None:
    if r.sbom is None:
        return None
    return {p["name"]: p["version"] for p in r.sbom.get(key, [])}


@dataclass
class Comparison:
    a: Record
    b: Record
    sections: list[Section]

    @property
    def identical(self) -> bool:
        return all(s.empty for s in self.sections)

    def as_dict(self) -> dict[str, Any]:
        return {
            "a": {"ref": self.a.ref, "where": self.a.where, "digest": self.a.digest},
            "b": {"ref": self.b.ref, "where": self.b.where, "digest": self.b.digest},
            "identical": self.identical,
            **{s.name: s.as_dict() for s in self.sections},
        }


def compare(a: Record, b: Record) -> Comparison:
    return Comparison(a, b, [
        _section("image", _facts(a), _facts(b)),
        _section("components", _components(a), _components(b)),
        _section("patches", _patches(a), _patches(b)),
        _section("python_packages", _packages(a, "python_packages"), _packages(b, "python_packages")),
        _section("os_packages", _packages(a, "os_packages"), _packages(b, "os_packages")),
    ])


def lines(c: Comparison) -> list[str]:
    """The comparison as text: one line per difference, one summary line per section."""
    out = [f"--- {c.a.ref} ({c.a.where}{', ' + c.a.digest[:19] if c.a.digest else ''})",
           f"+++ {c.b.ref} ({c.b.where}{', ' + c.b.digest[:19] if c.b.digest else ''})"]
    for s in c.sections:
        title = s.name.replace("_", " ")
        if not s.known:
            out.append(f"{title}: not recorded in both images (built before rlbox recorded an SBOM?)")
            continue
        if s.empty:
            out.append(f"{title}: no change ({s.same})")
            continue
        counts = ", ".join(f"{n} {w}" for n, w in ((len(s.changed), "changed"), (len(s.added), "added"),
                                                   (len(s.removed), "removed")) if n)
        out.append(f"{title}: {counts}, {s.same} unchanged")
        for key, (old, new) in s.changed.items():
            out.append(f"  ~ {key}: {old} -> {new}")
        for key, value in s.added.items():
            out.append(f"  + {key}: {value}")
        for key, value in s.removed.items():
            out.append(f"  - {key}: {value}")
    return out
