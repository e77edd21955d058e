"""Hosts with engines of their own, for the delivery tests (tests/delivery/test_delivery_execute.py): per host a second
dockerd (its own data root, exec root, pid file and unix socket; a bridge of its own, no iptables) and a
throwaway sshd on its own loopback address whose sessions reach that engine (SetEnv DOCKER_HOST).
All sshds accept one client key, so a chain of hosts can ssh to each other with a forwarded
agent as real nodes do.

    with EngineHosts(workdir, 3, prefix="ds") as hosts:
        hosts.cluster_file(path)              # a cluster YAML naming them
        hosts[0].docker("image", "ls")       # that host's engine, directly

Everything is named by ``prefix`` and removed on exit (engines stopped, mounts, directories).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import yaml

from support.sshd import SshServer, _end_tree

DOCKERD = shutil.which("dockerd") or "/usr/sbin/dockerd"


class HostSshd(SshServer):
    """An sshd on a given loopback address whose sessions talk to one engine."""

    def __init__(self, workdir: Path, address: str, docker_host: str):
        super().__init__(workdir)
        self.host = address
        self.docker_host = docker_host

    def _sshd_config(self) -> str:
        return super()._sshd_config() + f"SetEnv DOCKER_HOST={self.docker_host}\n"

    def stop_listening(self) -> None:
        """Its listener ends: a new connection is refused; the connections it has (setsid) go on."""
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def listen_again(self) -> None:
        """A listener again, on the same address, port and keys."""
        if not self._start():
            raise RuntimeError(f"sshd did not come up again on {self.host}:{self.port}:\n{self._log_text()}")


class EngineHost:
    def __init__(self, root: Path, name: str, address: str, insecure_registry: str | None, index: int = 0):
        self.name, self.address, self.index = name, address, index
        self.root = root
        self.exec_root = Path(f"/run/{name}")  # short: socket paths are limited to 107 bytes
        self.sock = self.exec_root / "docker.sock"
        self.insecure_registry = insecure_registry
        self.proc: subprocess.Popen | None = None
        self.sshd: HostSshd | None = None

    @property
    def bridge(self) -> str:
        """This engine's own bridge (an interface name: at most 15 characters)."""
        return f"rbx{os.getpid() % 100000}e{self.index}"

    def bridge_up(self) -> None:
        self.bridge_down()
        subnet = f"10.203.{(os.getpid() * 8 + self.index) % 250}.1/24"
        for argv in (["ip", "link", "add", self.bridge, "type", "bridge"],
                     ["ip", "addr", "add", subnet, "dev", self.bridge], ["ip", "link", "set", self.bridge, "up"]):
            subprocess.run(argv, check=True, capture_output=True)

    def bridge_down(self) -> None:
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)

    @property
    def docker_host(self) -> str:
        return f"unix://{self.sock}"

    def start(self) -> None:
        self.start_engine()
        self.sshd = HostSshd(self.root / "ssh", self.address, self.docker_host).__enter__()

    def start_engine(self) -> None:
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        self.exec_root.mkdir(parents=True, exist_ok=True)
        # A bridge of its own, never --bridge=none: a dockerd in this (the machine's) network
        # namespace started with --bridge=none deletes the interface docker0 at start (moby's
        # removeDefaultBridgeInterface), which breaks the machine's own engine for every test after.
        self.bridge_up()
        argv = [DOCKERD, "--data-root", str(self.root / "data"), "--exec-root", str(self.exec_root),
                "--pidfile", str(self.exec_root / "dockerd.pid"), "-H", self.docker_host,
                "--iptables=false", "--ip-masq=false", "--bridge", self.bridge]
        if self.insecure_registry:
            argv += ["--insecure-registry", self.insecure_registry]
        with open(self.root / "dockerd.log", "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd {self.name} stopped: {(self.root / 'dockerd.log').read_text()[-800:]}")
            if self.docker("version", check=False).returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"dockerd {self.name} did not answer in 60 s")

    def docker(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "-H", self.docker_host, *args], capture_output=True, text=True,
                              check=check, **kw)

    def image_id(self, image: str) -> str | None:
        proc = self.docker("image", "inspect", "--format", "{{.Id}}", image, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else None

    def stop(self) -> None:
        if self.sshd is not None:
            self.sshd.__exit__(None, None, None)
            self.sshd = None
        self.stop_engine()
        shutil.rmtree(self.exec_root, ignore_errors=True)

    def stop_engine(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            _end_tree(self.proc.pid, timeout=20)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        netns = self.exec_root / "netns" / "default"
        if netns.exists():
            subprocess.run(["umount", str(netns)], capture_output=True)
        self.bridge_down()


class EngineHosts:
    def __init__(self, workdir: Path, count: int, *, prefix: str = "ds", first_address: int = 20,
                 insecure_registry: str | None = None):
        self.workdir = Path(workdir)
        self.hosts = [EngineHost(self.workdir / f"{prefix}-h{i}", f"{prefix}-eng{os.getpid()}-{i}",
                                 f"127.0.0.{first_address + i}", insecure_registry, i) for i in range(count)]

    def __enter__(self) -> "EngineHosts":
        try:
            for h in self.hosts:
                h.start()
            key = self.hosts[0].sshd.identity_file.with_name("id_ed25519.pub").read_text()
            known = "".join(h.sshd.known_hosts.read_text() for h in self.hosts)
            for h in self.hosts:  # one key and one known_hosts for all, as on a cluster
                h.sshd.authorized_keys.write_text(key)
            self.known_hosts.write_text(known)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for h in self.hosts:
            h.stop()

    def __getitem__(self, i: int) -> EngineHost:
        return self.hosts[i]

    def __len__(self) -> int:
        return len(self.hosts)

    @property
    def known_hosts(self) -> Path:
        return self.workdir / "known_hosts"

    @property
    def identity_file(self) -> Path:
        return self.hosts[0].sshd.identity_file

    def ssh_argv(self, host: EngineHost, *remote_cmd: str) -> list[str]:
        """ssh to ``host`` with the key and known_hosts every host shares."""
        return ["ssh", "-F", "none", "-i", str(self.identity_file), "-p", str(host.sshd.port),
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", f"{host.sshd.user}@{host.address}", "--",
                *remote_cmd]

    def cluster(self, hosts: list[EngineHost] | None = None) -> dict:
        return {"ssh": {"identity_file": str(self.identity_file), "known_hosts": str(self.known_hosts)},
                "hosts": [{"host": h.address, "ssh": {"port": h.sshd.port}} for h in (hosts or self.hosts)]}

    def cluster_file(self, path: Path, hosts: list[EngineHost] | None = None) -> Path:
        path.write_text(yaml.safe_dump(self.cluster(hosts)))
        return path
