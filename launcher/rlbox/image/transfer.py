"""`rlbox push` and `rlbox pull`: images between the local engine and a registry.

Push retags the local image under its human tag (``verl_pt27_25rc3:a3-arm``) and an immutable
one carrying the rlbox commit it was built from (``a3-arm-<sha12>``, from the image's
``org.opencontainers.image.revision`` label), and pushes both with docker-py. Pull fetches by
tag or digest, or (``--hardware auto``) the release's variant for this host: its architecture
and the chip `npu-smi info` reports. A variant that does not fit the host is refused before
the pull; a pulled image whose labels or architecture disagree is refused and removed again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from rlbox.registry import client as registry
from rlbox.core import npu
from rlbox.core.errors import RlboxError, did_you_mean
from rlbox.image.matrix import Matrix, ResolvedVariant
from rlbox.image.schema import Hardware
from rlbox.image.mirrors import Profile
from rlbox.registry import auth, reference
from rlbox.registry.auth import Credentials
from rlbox.registry.reference import Reference

REVISION_LABEL = "org.opencontainers.image.revision"
SHA = re.compile(r"^[0-9a-f]{40}$")

Echo = Callable[[str], None]


# ---------------------------------------------------------------------------------------------
# The host and what fits it.


@dataclass(frozen=True)
class HostFacts:
    platform: str  # linux/amd64 or linux/arm64
    chip: str | None  # what `npu-smi info` names the NPU (910B3, Ascend910); None if unknown
    chip_problem: str = ""  # why the chip is unknown

    def describe(self) -> str:
        return f"{self.platform}, npu-smi {self.chip or 'unavailable'}"


def host_facts() -> HostFacts:
    chip, problem = npu.local_chip()
    return HostFacts(reference.host_platform(), chip, problem)


def hardware_for_chip(hardware: dict[str, Hardware], chip: str) -> list[str]:
    """Profiles whose `npu_smi_chip` the chip name starts with (910B3 -> a2, ax; Ascend910 -> a3);
    the longest matching prefix wins."""
    matches = [(len(h.npu_smi_chip), name) for name, h in hardware.items()
               if h.npu_smi_chip not in ("", "none") and chip.startswith(h.npu_smi_chip)]
    if not matches:
        return []
    best = max(n for n, _ in matches)
    return [name for n, name in matches if n == best]


def _chip_fits(hw: Hardware, hardware: dict[str, Hardware], chip: str) -> bool:
    if hw.npu_smi_chip in ("", "none"):  # a simulation image needs no NPU
        return True
    return any(hardware[name].npu_smi_chip == hw.npu_smi_chip for name in hardware_for_chip(hardware, chip))


def variant_misfit(m: Matrix, variant: ResolvedVariant, facts: HostFacts) -> str | None:
    """Why ``variant`` cannot run on this host (one line), or None."""
    if variant.platform != facts.platform:
        return (f"{variant.ref} is {variant.platform} (hardware {variant.hardware_name}), this host is "
                f"{facts.platform}{_suggest(m, variant, facts)}; --force pulls it anyway")
    if facts.chip and not _chip_fits(variant.hardware, m.hardware, facts.chip):
        return (f"{variant.ref} is for chip {variant.hardware.npu_smi_chip} (hardware {variant.hardware_name}), "
                f"this host's npu-smi reports {facts.chip}{_suggest(m, variant, facts)}; --force pulls it anyway")
    return None


def _suggest(m: Matrix, variant: ResolvedVariant, facts: HostFacts) -> str:
    """The variant of the same release that fits: by chip and platform, else (no npu-smi, or a
    simulation image) the same hardware on this host's platform."""
    try:
        return f": pull {choose_variant(m, variant.release.release, facts).ref} instead"
    except RlboxError:
        pass
    same = [v for v in m.variants if v.release.release == variant.release.release
            and v.hardware_name == variant.hardware_name and v.platform == facts.platform]
    return f": pull {same[0].ref} instead" if same else ""


def choose_variant(m: Matrix, release: str, facts: HostFacts) -> ResolvedVariant:
    """The release's variant for this host: same platform, hardware whose npu-smi chip the host
    reports (A2 and A+X share 910B and differ by platform)."""
    if release not in m.releases:
        raise RlboxError(f"unknown release '{release}'{did_you_mean(release, m.releases)}; "
                         f"known: {', '.join(sorted(m.releases))}")
    if not facts.chip:
        raise RlboxError(f"--hardware auto: cannot tell this host's NPU: {facts.chip_problem}; name the variant "
                         f"(RELEASE:VARIANT, see `rlbox images list`) or point {npu.NPU_SMI_ENV} at npu-smi")
    names = hardware_for_chip(m.hardware, facts.chip)
    fits = [v for v in m.variants if v.release.release == release and v.hardware_name in names
            and v.platform == facts.platform]
    if len(fits) == 1:
        return fits[0]
    have = ", ".join(f"{v.name} ({v.hardware_name}, {v.platform})" for v in m.variants if v.release.release == release)
    if not fits:
        known = f"hardware {'/'.join(names)}" if names else "no hardware profile (images/hardware.yaml)"
        raise RlboxError(f"release {release} has no variant for this host ({facts.platform}, npu-smi chip "
                         f"{facts.chip}: {known}); it has: {have}")
    raise RlboxError(f"release {release} has {len(fits)} variants for this host ({', '.join(v.name for v in fits)}): "
                     "name one (RELEASE:VARIANT)")


def default_release(m: Matrix, facts: HostFacts) -> str:
    """The one release with a variant for this host, when --release is not given."""
    names = hardware_for_chip(m.hardware, facts.chip) if facts.chip else []
    releases = sorted({v.release.release for v in m.variants if v.hardware_name in names and v.platform == facts.platform})
    if len(releases) == 1:
        return releases[0]
    if not releases:
        raise RlboxError(f"--hardware auto: no release has a variant for this host ({facts.describe()}); "
                         "see `rlbox images list`")
    raise RlboxError(f"--hardware auto: several releases fit this host ({', '.join(releases)}): give --release")


# ---------------------------------------------------------------------------------------------
# Names.


def _is_matrix_ref(m: Matrix | None, text: str) -> bool:
    release, sep, _ = text.partition(":")
    return bool(m and sep and "/" not in release and release in m.releases)


def remote_for(image: str, registry_host: str | None, mirror: Profile | None = None) -> Reference:
    """The registry reference for a local image name; ``registry_host`` replaces its registry and
    keeps the repository path (swr.../ascendhub/x -> 127.0.0.1:5000/ascendhub/x). A mirror
    profile first rewrites it by prefix (swr.../ascendhub/x -> quay.io/ascend/x)."""
    ref = Reference.parse(mirror.image(image) if mirror else image)
    if registry_host:
        ref = ref.with_registry(registry_host)
    if not ref.registry:
        raise RlboxError(f"{image}: no registry host in the name; give --registry HOST[:PORT]")
    return ref


def repository_for(m: Matrix | None, text: str, registry_host: str | None) -> Reference:
    """REPOSITORY of `rlbox images tags`: a release name of the matrix, or [HOST/]PATH."""
    if m and text in m.releases:
        rel = m.releases[text]
        text = f"{rel.image.registry}/{rel.image.name}"
    ref = Reference.parse(text)
    if ref.tag or ref.digest:
        raise RlboxError(f"{text}: give a repository (HOST/PATH), not a tag or digest")
    if registry_host:
        ref = ref.with_registry(registry_host)
    elif not ref.registry:
        raise RlboxError(f"{text}: no registry host; give HOST[:PORT]/PATH, a release name, or --registry HOST")
    return ref


def immutable_tag(human: str, revision: str | None) -> str:
    """``<human>-<sha12>`` from the image's revision label; refuses builds not from a commit."""
    rev = (revision or "").strip()
    if rev.endswith("-dirty"):
        raise RlboxError(f"the image was built from uncommitted changes (revision {rev}): no immutable tag for it; "
                         "commit and rebuild, give one with --immutable-tag TAG, or push without (--no-immutable-tag)")
    if not SHA.fullmatch(rev):
        raise RlboxError(f"the image's {REVISION_LABEL} label is {rev or 'missing'!r}, not a commit: no immutable tag "
                         "for it; build it with rlbox from a git checkout, give one with --immutable-tag TAG, or push "
                         "without (--no-immutable-tag)")
    return f"{human}-{rev[:12]}"


# ---------------------------------------------------------------------------------------------
# Engine messages -> one line.


def engine_error(host: str, action: str, message: str, creds: Credentials | None) -> RlboxError:
    text = " ".join(str(message).split())
    low = text.lower()
    name, port = reference.split_host(host)
    if "unauthorized" in low or "authentication required" in low or " 401 " in f" {low} ":
        if creds:
            what = (f"authentication failed for user {creds.username}: check {auth.ENV_USER}/"
                    f"{auth.ENV_PASSWORD} or `docker login {host}`")
        else:
            what = f"authentication required: set {auth.ENV_USER}/{auth.ENV_PASSWORD} or `docker login {host}`"
    elif "connection refused" in low or "no such host" in low or "dial tcp" in low or "i/o timeout" in low:
        port = port or (80 if reference.is_loopback(host) else 443)
        what = f"cannot connect to {name} port {port} ({action}: {text})"
    elif "denied" in low:
        what = f"access denied ({action}: {text})"
    elif "manifest unknown" in low or "not found" in low:
        what = f"{action}: not found ({text})"
    else:
        what = f"{action} failed: {text}"
    return RlboxError(auth.scrub(f"registry {host}: {what}", creds))


def _login(client, host: str, creds: Credentials | None) -> None:
    """docker-py login when the credentials come from the environment (the engine then holds
    them for this client only; nothing is written to a Docker config)."""
    from docker.errors import APIError

    if not creds or creds.source != "environment":
        return
    try:
        client.login(username=creds.username, password=creds.password, registry=host, reauth=True)
    except APIError as err:
        raise engine_error(host, "login", err.explanation or str(err), creds) from None


def _stream(lines, host: str, action: str, creds: Credentials | None, echo: Echo) -> tuple[str | None, list[str]]:
    """Consume a push/pull progress stream; raise on its error line; return (digest, statuses)."""
    digest, seen = None, []
    for line in lines:
        if line.get("error") or line.get("errorDetail"):
            msg = line.get("error") or (line.get("errorDetail") or {}).get("message", "")
            raise engine_error(host, action, msg, creds)
        aux = line.get("aux") or {}
        if aux.get("Digest"):
            digest = aux["Digest"]
        status = line.get("status") or ""
        if status.startswith("Digest: "):
            digest = status.split(" ", 1)[1].strip()
        if status in ("Pushed", "Layer already exists", "Pull complete", "Already exists"):
            echo(f"  {line.get('id', '')}: {status}")
        seen.append(status)
    return digest, seen


# ---------------------------------------------------------------------------------------------
# Push.


@dataclass(frozen=True)
class PushPlan:
    source: str  # the local image
    repository: Reference  # HOST/PATH in the registry, without tag
    tags: tuple[str, ...]  # human first, then the immutable one, then extras
    immutable: str | None
    revision: str | None

    def describe(self) -> str:
        return "".join(f"push {self.source} -> {self.repository.name}:{tag}\n" for tag in self.tags)

    def as_dict(self) -> dict:
        return {"source": self.source, "repository": self.repository.name, "tags": list(self.tags),
                "immutable": self.immutable, "revision": self.revision}


def push_source(m: Matrix | None, ref: str) -> tuple[str, str]:
    """The local image `rlbox push REF` pushes, and its human tag."""
    if _is_matrix_ref(m, ref):
        variant = m.get(ref)
        return variant.image, variant.tag
    parsed = Reference.parse(ref)
    if parsed.digest:
        raise RlboxError(f"{ref}: push takes a local image by name and tag, not a digest")
    source = str(parsed) if parsed.tag else f"{parsed}:latest"
    return source, parsed.tag or "latest"


def push_remote(m: Matrix | None, ref: str, registry_host: str | None, mirror: Profile | None = None) -> Reference:
    """The repository `rlbox push REF` pushes to (checked before the engine is asked anything)."""
    source, _ = push_source(m, ref)
    return remote_for(source, registry_host, mirror).with_tag(None)


def local_labels(client, m: Matrix | None, ref: str) -> dict[str, str]:
    """The labels of the local image `rlbox push REF` would push (what its plan needs of the engine)."""
    from docker.errors import ImageNotFound

    source, _ = push_source(m, ref)
    try:
        img = client.images.get(source)
    except ImageNotFound:
        hint = f"rlbox build {ref}" if _is_matrix_ref(m, ref) else "build or tag it first"
        raise RlboxError(f"image {source} is not on this engine: {hint}") from None
    return img.attrs.get("Config", {}).get("Labels") or {}


def plan_push(m: Matrix | None, ref: str, labels: dict[str, str], *, registry_host: str | None, extra_tags=(),
              immutable: str | None = None, no_immutable: bool = False, mirror: Profile | None = None) -> PushPlan:
    """Which tags go where, from the image's ``labels`` (its revision names the immutable tag). Pure."""
    source, human = push_source(m, ref)
    remote = push_remote(m, ref, registry_host, mirror)
    revision = labels.get(REVISION_LABEL)
    if immutable and no_immutable:
        raise RlboxError("give --immutable-tag TAG or --no-immutable-tag, not both")
    if no_immutable:
        fixed = None
    elif immutable:
        fixed = immutable
    else:
        try:
            fixed = immutable_tag(human, revision)
        except RlboxError as err:
            raise RlboxError(f"{source}: {err}") from None
    tags = [human] + ([fixed] if fixed else []) + list(extra_tags)
    for tag in tags:
        reference.check_tag(tag, "--tag" if tag in extra_tags else "--immutable-tag" if tag == immutable else "tag")
    return PushPlan(source, remote, tuple(dict.fromkeys(tags)), fixed, revision)


def push(plan: PushPlan, client, *, insecure: bool = False, echo: Echo = lambda _: None) -> str:
    """Check the registry and the immutable tag, push every tag; the pushed digest."""
    from docker.errors import APIError

    host = plan.repository.registry
    reg = registry.Registry(host, insecure=insecure)
    creds = reg.credentials
    reg.ping()
    img = client.images.get(plan.source)
    if plan.immutable:
        fixed = plan.repository.with_tag(plan.immutable)
        if reg.exists(fixed, actions="pull,push"):
            _, configs = reg.configs(fixed)
            if [c.digest for c in configs] != [img.id]:  # the image id is its config's digest
                there = ", ".join(c.digest[:19] for c in configs) or "none"
                raise RlboxError(f"{fixed} already exists for another image (config {there}, this one "
                                 f"{img.id[:19]}): an immutable tag is never moved; rebuild from a new commit "
                                 "or give another --immutable-tag")
    _login(client, host, creds)
    auth = creds.auth_config() if creds else None
    digests = {}
    added = []  # names tagged only to push: removed again, the engine keeps the names it had
    try:
        for n, tag in enumerate(plan.tags):
            name = f"{plan.repository.name}:{tag}"
            if _image_id(client, name) is None:
                added.append(name)
            img.tag(plan.repository.name, tag)
            echo(f"pushing {name}")
            try:
                lines = client.api.push(plan.repository.name, tag=tag, stream=True, decode=True, auth_config=auth)
                # layer lines for the first tag only: the others find every layer there
                digest, _ = _stream(lines, host, f"push {name}", creds, echo if n == 0 else lambda _: None)
            except APIError as err:
                raise engine_error(host, f"push {name}", err.explanation or str(err), creds) from None
            if not digest:
                raise RlboxError(f"registry {host}: push of {name} reported no digest")
            digests[tag] = digest
    finally:
        for name in added:
            client.images.remove(name, noprune=True)
    if len(set(digests.values())) != 1:
        raise RlboxError(f"registry {host}: the tags of {plan.source} were pushed with different digests: {digests}")
    return next(iter(digests.values()))


def _image_id(client, name: str) -> str | None:
    from docker.errors import ImageNotFound

    try:
        return client.images.get(name).id
    except ImageNotFound:
        return None


# ---------------------------------------------------------------------------------------------
# Pull.


@dataclass(frozen=True)
class PullTarget:
    remote: Reference
    variant: ResolvedVariant | None


def pull_target(m: Matrix | None, ref: str | None, *, hardware: str | None, release: str | None,
                registry_host: str | None, facts: HostFacts, mirror: Profile | None = None) -> PullTarget:
    """What to pull: RELEASE:VARIANT[@DIGEST], IMAGE[:TAG|@DIGEST], or the variant for --hardware."""
    if ref and hardware:
        raise RlboxError("give RELEASE:VARIANT or IMAGE, or --hardware, not both")
    if not ref and not hardware:
        raise RlboxError("what to pull: RELEASE:VARIANT, IMAGE[@sha256:...], or --hardware auto [--release R]")
    if release and not hardware:
        raise RlboxError("--release goes with --hardware (RELEASE:VARIANT names both)")
    if hardware:
        if m is None:
            raise RlboxError("--hardware needs the version matrix (an rlbox tree or RLBOX_ROOT)")
        if hardware == "auto":
            if not facts.chip:
                raise RlboxError(f"--hardware auto: cannot tell this host's NPU: {facts.chip_problem}; name the "
                                 f"variant (RELEASE:VARIANT, see `rlbox images list`) or point {npu.NPU_SMI_ENV} "
                                 "at npu-smi")
            variant = choose_variant(m, release or default_release(m, facts), facts)
        else:
            variant = m.for_hardware(release or _only_release_with(m, hardware), hardware)
        return PullTarget(remote_for(variant.image, registry_host, mirror), variant)
    base, _, digest = ref.partition("@")
    if _is_matrix_ref(m, base):
        variant = m.get(base)
        remote = remote_for(variant.image, registry_host, mirror)
        if digest:
            if not reference.DIGEST_RE.fullmatch(digest):
                raise RlboxError(f"{ref}: '{digest}' is not a digest (sha256:<64 hex>)")
            remote = remote.with_digest(digest)
        return PullTarget(remote, variant)
    remote = remote_for(ref, registry_host, mirror)
    if not remote.tag and not remote.digest:
        remote = remote.with_tag("latest")
    return PullTarget(remote, None)


def precheck(m: Matrix | None, target: PullTarget, facts: HostFacts, force: bool) -> list[str]:
    """Before pulling a variant: refuse one that does not fit this host (unless ``force``);
    the warnings to print."""
    variant = target.variant
    if variant is None or m is None:
        return []
    problem = variant_misfit(m, variant, facts)
    if problem and not force:
        raise RlboxError(f"not pulling {target.remote}: {problem}")
    warnings = [f"{problem.rsplit('; --force', 1)[0]} (--force)"] if problem else []
    if not facts.chip and variant.hardware.npu_smi_chip not in ("", "none"):
        warnings.append(f"chip not checked: {facts.chip_problem}")
    return warnings


def _only_release_with(m: Matrix, hardware: str) -> str:
    releases = sorted({v.release.release for v in m.variants if v.hardware_name == hardware})
    if len(releases) != 1:
        raise RlboxError(f"--hardware {hardware}: give --release ({', '.join(releases) or 'none has it'})")
    return releases[0]


def image_problems(attrs: dict, variant: ResolvedVariant | None, facts: HostFacts,
                   hardware: dict[str, Hardware]) -> tuple[list[str], list[str]]:
    """(mislabeled, misfit): the image disagrees with itself or with what was asked; it does not
    fit this host. From its Architecture and its io.rlbox.platform / io.rlbox.chip labels."""
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    arch = attrs.get("Architecture") or "?"
    actual = f"{attrs.get('Os') or 'linux'}/{arch}"
    wrong, misfit = [], []
    lp, lc = labels.get("io.rlbox.platform"), labels.get("io.rlbox.chip")
    if lp and lp != actual:
        wrong.append(f"labelled io.rlbox.platform={lp} but its architecture is {arch}")
    if variant:
        for key, want in (("io.rlbox.release", variant.release.release), ("io.rlbox.variant", variant.name),
                          ("io.rlbox.chip", variant.hardware.chip)):
            if labels.get(key) not in (None, want):
                wrong.append(f"labelled {key}={labels[key]}, but {variant.ref} is {want}")
        if actual != variant.platform and not wrong:
            wrong.append(f"it is {actual}, but {variant.ref} is {variant.platform}")
    if actual != facts.platform:
        misfit.append(f"it is {actual}, this host is {facts.platform}")
    if lc and facts.chip:
        profiles = [h for h in hardware.values() if h.chip == lc]
        if profiles and not any(_chip_fits(h, hardware, facts.chip) for h in profiles):
            misfit.append(f"it is for chip {lc} ({profiles[0].npu_smi_chip}), this host's npu-smi reports {facts.chip}")
    return wrong, misfit


@dataclass(frozen=True)
class Pulled:
    reference: str  # NAME@sha256:...
    local: str  # the name it has on the engine
    image_id: str
    also_tagged: str | None
    warnings: tuple[str, ...]


def pull(target: PullTarget, client, *, facts: HostFacts, hardware: dict[str, Hardware], insecure: bool = False,
         force: bool = False, echo: Echo = lambda _: None) -> Pulled:
    from docker.errors import APIError

    remote = target.remote
    host = remote.registry
    reg = registry.Registry(host, insecure=insecure)
    creds = reg.credentials
    digest = reg.digest(remote)  # reachability, credentials, existence: our own one-line errors
    local = str(remote)
    before = _image_id(client, local)
    _login(client, host, creds)
    echo(f"pulling {local}" + ("" if remote.digest else f" ({digest})"))
    try:
        lines = client.api.pull(remote.name, tag=remote.target, stream=True, decode=True,
                                auth_config=creds.auth_config() if creds else None)
        pulled_digest, _ = _stream(lines, host, f"pull {local}", creds, echo)
    except APIError as err:
        raise engine_error(host, f"pull {local}", err.explanation or str(err), creds) from None
    digest = pulled_digest or digest
    img = client.images.get(local)
    wrong, misfit = image_problems(img.attrs, target.variant, facts, hardware)
    if wrong or (misfit and not force):
        removed = _undo(client, local, before, img.id)
        problems = "; ".join(wrong + ([] if force else misfit))
        raise RlboxError(f"refused {remote.name}@{digest}: {problems}; "
                         + ("removed it again" if removed else "it was already on this engine, left as it was"))
    warnings = [f"{local}: {p} (--force)" for p in misfit]
    also = None
    if target.variant and remote.tag and local != target.variant.image:
        img.tag(*target.variant.image.rsplit(":", 1))
        also = target.variant.image
    return Pulled(f"{remote.name}@{digest}", local, img.id, also, tuple(warnings))


def _undo(client, name: str, before: str | None, new: str) -> bool:
    """Remove what a pull added under ``name``; put back what the name pointed to before."""
    if before == new:
        return False
    client.images.remove(name)
    if before and "@" not in name:
        repo, _, tag = name.rpartition(":")
        client.images.get(before).tag(repo, tag)
    return True


def tag_rows(reg: registry.Registry, repo: Reference) -> list[dict]:
    """Every tag of ``repo`` with its digest, architecture and io.rlbox.* labels (`rlbox images tags`)."""
    rows = []
    for tag in sorted(reg.tags(repo.api_repository)):
        digest, configs = reg.configs(repo.with_tag(tag))
        for cfg in configs:
            labels = cfg.labels
            rows.append({
                "tag": tag,
                "reference": f"{repo.name}@{digest}",
                "digest": digest,
                "architecture": cfg.platform,
                "release": labels.get("io.rlbox.release"),
                "variant": labels.get("io.rlbox.variant"),
                "hardware": labels.get("io.rlbox.hardware"),
                "platform": labels.get("io.rlbox.platform"),
                "revision": labels.get("org.opencontainers.image.revision"),
                "labels": {k: v for k, v in labels.items() if k.startswith("io.rlbox.")},
            })
    return rows
