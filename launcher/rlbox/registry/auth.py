"""Registry credentials and challenges: ``RLBOX_REGISTRY_USER`` / ``RLBOX_REGISTRY_PASSWORD`` or
the Docker config (``auths``, ``credsStore``, ``credHelpers``); the ``WWW-Authenticate``
challenge a registry answers a 401 with; and scrubbing a password out of any text."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from rlbox.core.errors import RlboxError
from rlbox.registry.reference import DOCKER_HUB

ENV_USER = "RLBOX_REGISTRY_USER"
ENV_PASSWORD = "RLBOX_REGISTRY_PASSWORD"


# ---------------------------------------------------------------------------------------------
# Credentials.


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str = field(repr=False)
    source: str = ""

    def __repr__(self) -> str:  # never the password
        return f"Credentials(username={self.username!r}, source={self.source!r})"

    def auth_config(self) -> dict[str, str]:
        """For docker-py's push/pull/login ``auth_config``."""
        return {"username": self.username, "password": self.password}


def _auth_keys(host: str) -> list[str]:
    keys = [host, f"https://{host}", f"http://{host}", f"https://{host}/v1/", f"https://{host}/v2/"]
    if host in (DOCKER_HUB, "index.docker.io", "registry-1.docker.io"):
        keys.insert(0, "https://index.docker.io/v1/")
    return keys


def _from_helper(helper: str, host: str, path: str | None) -> Credentials | None:
    """``docker-credential-<helper> get`` with the host on stdin (Docker's protocol)."""
    exe = shutil.which(f"docker-credential-{helper}", path=path)
    if exe is None:
        return None
    for server in (host, f"https://{host}"):
        try:
            proc = subprocess.run([exe, "get"], input=server, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if proc.returncode != 0:
            continue  # "credentials not found in native keychain": try the next form, then give up
        try:
            data = json.loads(proc.stdout)
        except ValueError:
            raise RlboxError(f"docker-credential-{helper} get: printed no JSON for {host}") from None
        user, secret = data.get("Username") or "", data.get("Secret") or ""
        if secret:
            return Credentials(user, secret, f"docker-credential-{helper}")
    return None


def credentials_for(host: str, environ: dict[str, str] | None = None) -> Credentials | None:
    """Credentials for a registry host: the environment first, then the Docker config
    (``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``)."""
    env = os.environ if environ is None else environ
    user, password = env.get(ENV_USER), env.get(ENV_PASSWORD)
    if user or password:
        if not (user and password):
            missing = ENV_PASSWORD if user else ENV_USER
            raise RlboxError(f"{missing} is not set: give both {ENV_USER} and {ENV_PASSWORD}, or neither")
        return Credentials(user, password, "environment")
    path = Path(env["DOCKER_CONFIG"]) / "config.json" if env.get("DOCKER_CONFIG") else Path.home() / ".docker" / "config.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise RlboxError(f"{path}: not valid JSON; fix it or run `docker login {host}` again") from None
    if not isinstance(cfg, dict):
        return None
    helper = (cfg.get("credHelpers") or {}).get(host) or cfg.get("credsStore")
    if helper:
        found = _from_helper(helper, host, env.get("PATH"))
        if found:
            return found
    auths = cfg.get("auths") or {}
    for key in _auth_keys(host):
        entry = auths.get(key)
        if not isinstance(entry, dict):
            continue
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise RlboxError(f"{path}: auths.{key}.auth is not base64 user:password; "
                                 f"run `docker login {host}` again") from None
            if user and password:
                return Credentials(user, password, str(path))
        if entry.get("username") and entry.get("password"):
            return Credentials(entry["username"], entry["password"], str(path))
    return None


# ---------------------------------------------------------------------------------------------
# The challenge a registry answers a 401 with.


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "basic" or "bearer"
    params: dict[str, str]


def parse_www_authenticate(header: str) -> Challenge:
    """``Bearer realm="https://x/token",service="x",scope="repository:a/b:pull"`` or
    ``Basic realm="basic-realm"``: the scheme (lower case) and its parameters."""
    scheme, _, rest = header.strip().partition(" ")
    params = {}
    for m in re.finditer(r'([A-Za-z_][\w-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))', rest):
        value = m.group(2) if m.group(2) is not None else m.group(3)
        params[m.group(1).lower()] = re.sub(r"\\(.)", r"\1", value)
    return Challenge(scheme.lower(), params)


def scrub(text: str, credentials: Credentials | None) -> str:
    """The text with the password (and its base64 forms) blanked out, whatever produced it."""
    if credentials and credentials.password:
        secrets = {credentials.password,
                   base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()}
        for s in secrets:
            if len(s) >= 3:  # shorter ones would blank ordinary words; rlbox never prints them anyway
                text = text.replace(s, "***")
    return text
