"""Planning a testbed: hosts, addresses, folders and the exact argv of every step and process.
Pure values; `--dry-run` prints them and `execute` carries them out.

One host is:

* a network namespace ``rlbox-NAME-hI`` with a veth (``eth0`` inside) into the bridge
  ``rlbox-NAME`` of the root namespace, and the address ``.I`` of the subnet (the bridge holds
  ``.254``, so this machine reaches every host);
* a holder process (``nsenter --net`` + ``unshare --mount --pid --fork --mount-proc``) whose
  init script gives the host its own ``/run`` (a tmpfs), its own ``/dev`` (a tmpfs with the
  machine's nodes, plus ``davinciN``, ``davinci_manager``, ``devmm_svm`` and ``hisi_hdc`` made
  as char 1:3, what ``/dev/null`` is), and overlays on ``/usr/local`` and ``/etc`` holding the
  driver tree with ``version.info``, ``/usr/local/dcmi``, ``npu-smi`` and
  ``/etc/ascend_install.info`` (written by ``cluster.sim.write_stand_ins``);
* its own dockerd (data root under the host's folder, exec root and socket in its ``/run``,
  also listening on ``HOSTDIR/docker.sock`` for this machine; ``--iptables=false
  --bridge=none``) and its own sshd on the host's address (a generated host key; root logs in
  with the testbed's key; ``docker`` over ssh reaches the host's engine), both started inside
  the holder's namespaces.

The namespaces are entered with ``nsenter``, never ``ip netns exec`` (which remounts /sys, and
dockerd then finds no devices cgroup).
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path

from rlbox.cluster import sim
from rlbox.core.errors import RlboxError

DEFAULT_ROOT = "/var/lib/rlbox-testbed"
DEFAULT_NAME = "tb0"
DEFAULT_SUBNET = "10.201.0.0/24"
DEFAULT_DRIVER = "25.3.rc1"
MAX_HOSTS = 16
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,4}$")  # interface names: rlbox-NAME-hII fits in 15 characters
DEVICES = {"a2": 8, "ax": 8, "a3": 16}
HOST_DOCKER_SOCKET = "/run/docker.sock"  # inside a host: where a real host's engine listens

# The holder's init: runs as PID 1 of the host's PID namespace, inside its private mount
# namespace, and sets the host's own /run, /dev and driver files up. Constant text; every value
# is a positional argument. It touches nothing outside the namespace (mounts are private).
HOST_INIT = r"""set -eu
dir=$1
ulimit -Sn "$(ulimit -Hn)"
mnt=$dir/mnt
mkdir -p "$mnt/dev" "$mnt/ovl"
mount -t tmpfs -o mode=0755 rlbox-testbed-run /run
mkdir -p /run/sshd /run/lock
mount --rbind /dev "$mnt/dev"
mount -t tmpfs -o mode=0755,nosuid rlbox-testbed-dev /dev
for e in "$mnt"/dev/* "$mnt"/dev/.[!.]*; do
  [ -e "$e" ] || [ -L "$e" ] || continue
  n=${e##*/}
  if mountpoint -q "$e"; then
    if [ -d "$e" ]; then mkdir -p "/dev/$n"; else touch "/dev/$n"; fi
    mount --rbind "$e" "/dev/$n"
  else
    cp -a "$e" /dev/
  fi
done
umount -l "$mnt/dev"
for n in $(ls "$dir/stand-ins/dev"); do mknod -m 0666 "/dev/$n" c 1 3; done
mount -t tmpfs -o mode=0755 rlbox-testbed-overlay "$mnt/ovl"
for d in usr-local etc; do mkdir -p "$mnt/ovl/$d/upper" "$mnt/ovl/$d/work"; done
mount -t overlay rlbox-testbed -o "lowerdir=/usr/local,upperdir=$mnt/ovl/usr-local/upper,workdir=$mnt/ovl/usr-local/work" /usr/local
mount -t overlay rlbox-testbed -o "lowerdir=/etc,upperdir=$mnt/ovl/etc/upper,workdir=$mnt/ovl/etc/work" /etc
mkdir -p /usr/local/Ascend /usr/local/bin
cp -a "$dir/stand-ins/driver" /usr/local/Ascend/driver
cp -a "$dir/stand-ins/dcmi" /usr/local/dcmi
cp "$dir/stand-ins/npu-smi" /usr/local/bin/npu-smi
cp "$dir/stand-ins/ascend_install.info" /etc/ascend_install.info
cp "$dir/stand-ins/hccn.conf" /etc/hccn.conf
ip link set lo up
touch "$dir/ready"
trap 'exit 0' TERM INT
while :; do sleep 3600 & wait $! || true; done
"""

# Changing a running host's NPU stand-ins (fewer devices, another driver): run inside the host.
HOST_RESHAPE = r"""set -eu
dir=$1
rm -f /dev/davinci[0-9]*
for n in $(ls "$dir/stand-ins/dev"); do [ -e "/dev/$n" ] || mknod -m 0666 "/dev/$n" c 1 3; done
rm -rf /usr/local/Ascend/driver
cp -a "$dir/stand-ins/driver" /usr/local/Ascend/driver
cp "$dir/stand-ins/npu-smi" /usr/local/bin/npu-smi
cp "$dir/stand-ins/hccn.conf" /etc/hccn.conf
"""


@dataclass(frozen=True)
class HostPlan:
    index: int  # 1-based: host 1 is the first of the cluster file (the Ray head)
    netns: str
    veth: str  # the root namespace's end; the host's end is eth0
    address: str
    prefixlen: int
    gateway: str
    dir: str
    devices: int
    driver: str

    @property
    def name(self) -> str:
        return f"h{self.index}"

    @property
    def socket(self) -> str:
        """The host's engine, from this machine."""
        return f"{self.dir}/docker.sock"

    def describe(self) -> str:
        return (f"# host {self.index}: {self.address} in {self.netns}, {self.devices} NPUs, driver {self.driver}, "
                f"folder {self.dir}\n"
                + shlex.join(self.init_argv()[:-3]) + " <HOST_INIT> " + shlex.join(self.init_argv()[-2:]) + "\n"
                + shlex.join(self.dockerd_argv("<init pid>")) + "\n" + shlex.join(self.sshd_argv("<init pid>")) + "\n")

    def as_dict(self) -> dict:
        return asdict(self) | {"socket": self.socket, "init": self.init_argv(), "dockerd": self.dockerd_argv("<init pid>"),
                               "sshd": self.sshd_argv("<init pid>")}

    def init_argv(self) -> list[str]:
        return ["nsenter", f"--net=/var/run/netns/{self.netns}", "--",
                "unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc", "--",
                "sh", "-c", HOST_INIT, "rlbox-testbed-host", self.dir]

    def enter(self, init_pid: int | str) -> list[str]:
        """The prefix running a command inside the host (its network, mount and PID namespace)."""
        return ["nsenter", f"--target={init_pid}", "--mount", "--net", "--pid", "--"]

    def dockerd_argv(self, init_pid: int | str) -> list[str]:
        return [*self.enter(init_pid), "setsid", "-f", "dockerd",
                "--config-file", f"{self.dir}/daemon.json",
                "--data-root", f"{self.dir}/docker", "--exec-root", "/run/docker", "--pidfile", "/run/docker.pid",
                "-H", f"unix://{HOST_DOCKER_SOCKET}", "-H", f"unix://{self.socket}",
                "--iptables=false", "--ip-masq=false", "--bridge=none",
                "--cgroup-parent", f"/{self.netns}", "--log-level", "warn"]

    def sshd_argv(self, init_pid: int | str) -> list[str]:
        return [*self.enter(init_pid), "/usr/sbin/sshd", "-f", f"{self.dir}/sshd_config", "-E", f"{self.dir}/sshd.log"]

    def sshd_config(self, authorized_keys: str) -> str:
        return "\n".join([
            "# generated by rlbox testbed: this host's sshd",
            f"ListenAddress {self.address}",
            "Port 22",
            f"HostKey {self.dir}/ssh_host_ed25519_key",
            "PidFile /run/sshd.pid",
            f"AuthorizedKeysFile {authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "X11Forwarding no",
            "AllowTcpForwarding yes",
            "AllowStreamLocalForwarding yes",
            "MaxStartups 200:30:400",
            "MaxSessions 100",
            "ClientAliveInterval 5",  # a session whose client vanished (a cut network, a killed rlbox) ends in ~15 s
            "ClientAliveCountMax 3",
            "PrintMotd no",
            f"SetEnv DOCKER_HOST=unix://{HOST_DOCKER_SOCKET}",
            "Subsystem sftp internal-sftp",
            "",
        ])


@dataclass(frozen=True)
class TestbedPlan:
    name: str
    root: str
    subnet: str
    hardware: str
    hosts: tuple[HostPlan, ...]
    image: str | None = None
    nofile: int = 65536  # the node containers' open-files limit (the cluster file's nofile:)
    slurm: bool = False  # munged + slurmctld on host 1, slurmd on every host (testbed.slurm)

    __test__ = False  # not a pytest class

    @property
    def dir(self) -> str:
        return f"{self.root}/{self.name}"

    @property
    def bridge(self) -> str:
        return f"rlbox-{self.name}"

    @property
    def gateway(self) -> str:
        return self.hosts[0].gateway

    @property
    def state_file(self) -> str:
        return f"{self.dir}/testbed.json"

    @property
    def cluster_file(self) -> str:
        return f"{self.dir}/cluster.yaml"

    @property
    def identity_file(self) -> str:
        return f"{self.dir}/id_ed25519"

    @property
    def known_hosts(self) -> str:
        return f"{self.dir}/known_hosts"

    def forward_rule(self) -> list[str]:
        """Bridged traffic between hosts passes the root namespace's FORWARD chain (br_netfilter;
        Docker sets its policy to DROP): this rule lets the testbed's own bridge through."""
        return ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT", "-m", "comment",
                "--comment", f"rlbox testbed {self.name}"]

    def network_steps(self) -> list[list[str]]:
        net = ipaddress.ip_network(self.subnet)
        steps = [["ip", "link", "add", self.bridge, "type", "bridge"],
                 ["ip", "addr", "add", f"{self.gateway}/{net.prefixlen}", "dev", self.bridge],
                 ["ip", "link", "set", self.bridge, "up"],
                 ["iptables", "-I", *self.forward_rule()]]
        for h in self.hosts:
            steps += [["ip", "netns", "add", h.netns],
                      ["ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.netns],
                      ["ip", "link", "set", h.veth, "master", self.bridge],
                      ["ip", "link", "set", h.veth, "up"],
                      ["ip", "-n", h.netns, "addr", "add", f"{h.address}/{h.prefixlen}", "dev", "eth0"],
                      ["ip", "-n", h.netns, "link", "set", "eth0", "up"],
                      ["ip", "-n", h.netns, "link", "set", "lo", "up"]]
        return steps

    def cluster_yaml(self) -> str:
        lines = [f"# generated by `rlbox testbed up --name {self.name}`: the testbed's {len(self.hosts)} host(s)",
                 f"# (rlbox run --cluster {self.cluster_file} ...); removed by `rlbox testbed down --name {self.name}`"]
        if self.image:
            lines.append(f"image: {self.image}")
        lines += [f"hardware: {self.hardware}",
                  f"nofile: {self.nofile}  # this machine's hard open-files limit, which every host shares",
                  f"ssh: {{user: root, identity_file: {self.identity_file}, known_hosts: {self.known_hosts}}}"]
        if self.slurm:  # `rlbox run --backend slurm` runs sbatch/squeue/scancel on host 1, the login node
            lines.append(f"slurm: {{login: {self.hosts[0].address}, partition: rlbox}}")
        lines.append("hosts:")
        lines += [f"  - host: {h.address}" for h in self.hosts]
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict:
        return {"name": self.name, "root": self.root, "subnet": self.subnet, "bridge": self.bridge,
                "gateway": self.gateway, "hardware": self.hardware, "image": self.image, "nofile": self.nofile,
                "network": self.network_steps(), "hosts": [h.as_dict() for h in self.hosts],
                "cluster_file": self.cluster_file, "cluster_yaml": self.cluster_yaml(), "slurm": self.slurm}

    def describe(self) -> str:
        """What `rlbox testbed up --dry-run` prints: every step and process, in order."""
        out = [f"# testbed {self.name}: {len(self.hosts)} {self.hardware} host(s) on {self.subnet} "
               f"(bridge {self.bridge} {self.gateway}), state {self.state_file}"]
        out += [shlex.join(s) for s in self.network_steps()]
        for h in self.hosts:
            first, *rest = h.describe().splitlines()
            out += ["", first,
                    f"#   stand-ins: cluster.sim.write_stand_ins({h.dir}/stand-ins, {self.hardware}, {h.devices}, {h.driver})",
                    *rest]
        if self.slurm:
            from rlbox.testbed.slurm import plan_slurm

            out += ["", *plan_slurm(self).describe().splitlines()]
        if self.image:
            out += ["", f"# image {shlex.quote(self.image)}: docker save | docker -H unix://HOSTDIR/docker.sock load, "
                        "on every host"]
        out += ["", f"# cluster file: {self.cluster_file}", *("#   " + line for line in self.cluster_yaml().splitlines())]
        return "\n".join(out) + "\n"


def per_host(values: tuple[str, ...], option: str, hosts: int, parse) -> dict[int, object]:
    """``--host-devices 2=8`` style options: host index (1-based) -> parsed value."""
    out = {}
    for text in values:
        index, sep, value = text.partition("=")
        if not sep or not (index.isascii() and index.isdigit()) or not value:
            raise RlboxError(f"{option} {text!r}: give HOST=VALUE, HOST a host number 1..{hosts}")
        if not 1 <= int(index) <= hosts:
            raise RlboxError(f"{option} {text!r}: host {index} is not one of 1..{hosts}")
        out[int(index)] = parse(value, f"{option} {text!r}")
    return out


def _devices(value: str, where: str) -> int:
    if not (value.isascii() and value.isdigit()) or not 0 <= int(value) <= 32:
        raise RlboxError(f"{where}: a device count is 0..32")
    return int(value)


def _driver(value: str, where: str) -> str:
    if not re.fullmatch(r"\d{1,3}\.\d{1,3}\.(rc\d{1,3}|\d{1,3})(\.[a-z0-9]{1,8})?", value.lower()):
        raise RlboxError(f"{where}: a driver version looks like 25.3.rc1 or 24.1.0")
    return value.lower()


def check_name(name: str) -> str:
    """A testbed's name: it becomes interface names and the folder ROOT/NAME, so never a path."""
    if not NAME_RE.fullmatch(name):
        raise RlboxError(f"--name {name[:60]!r}: a testbed name is a lower-case letter then up to 4 letters or digits "
                         "(it names interfaces of at most 15 characters)")
    return name


PRIVATE_NETWORKS = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


def check_subnet(subnet: str, where: str = "--subnet") -> "ipaddress.IPv4Network":
    """A testbed's network: an IPv4 /24 or larger inside the private ranges (RFC 1918: 10/8,
    172.16/12, 192.168/16), written as a network (no host bits); never loopback, link-local or
    another reserved range (Python's ``is_private`` takes 127/8 and 169.254/16 too)."""
    shown = repr(subnet[:60]) if isinstance(subnet, str) else repr(subnet)
    try:
        net = (ipaddress.ip_network(subnet, strict=True)
               if isinstance(subnet, str) and subnet.isascii() and len(subnet) <= 43 else None)
    except ValueError as err:
        raise RlboxError(f"{where} {shown}: {err}") from None
    if net is None or net.version != 4 or net.num_addresses < 256 or not any(net.subnet_of(p) for p in PRIVATE_NETWORKS):
        raise RlboxError(f"{where} {shown}: give a private IPv4 /24 or larger, inside 10.0.0.0/8, 172.16.0.0/12 or "
                         f"192.168.0.0/16 (default {DEFAULT_SUBNET})")
    return net  # type: ignore[return-value]


def check_root(root: str) -> str:
    """The folder holding every testbed: an absolute path, never one with spaces, quotes or `..`."""
    if (not root.startswith("/") or not re.fullmatch(r"[A-Za-z0-9/._-]+", root)
            or ".." in root.split("/") or len(root) > 200):
        raise RlboxError(f"--root {root!r}: an absolute path of letters, digits and / . _ - (no ..)")
    return root


def check_driver(value: str, where: str) -> str:
    return _driver(value, where)


def plan_testbed(*, hosts: int, hardware: str, name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET,
                 root: str = DEFAULT_ROOT, driver: str = DEFAULT_DRIVER, image: str | None = None,
                 host_devices: tuple[str, ...] = (), host_driver: tuple[str, ...] = (),
                 nofile: int = 65536, slurm: bool = False) -> TestbedPlan:
    check_name(name)
    if hardware not in sim.CHIPS:
        raise RlboxError(f"--hardware {hardware}: choose a2, a3 or ax")
    if not 1 <= hosts <= MAX_HOSTS:
        raise RlboxError(f"--hosts {hosts}: a testbed has 1..{MAX_HOSTS} hosts")
    net = check_subnet(subnet)
    if image is not None:
        from rlbox.registry.reference import Reference

        try:  # the distribution spec's grammar: never an option (`-x`), a space or a ';'
            Reference.parse(image)
        except RlboxError as err:
            raise RlboxError(f"--image: {err}") from None
    check_root(root)
    driver = _driver(driver, "--driver")
    devices = per_host(host_devices, "--host-devices", hosts, _devices)
    drivers = per_host(host_driver, "--host-driver", hosts, _driver)
    base = net.network_address
    gateway = str(base + 254)
    folder = f"{root.rstrip('/')}/{name}"
    plans = tuple(HostPlan(index=i, netns=f"rlbox-{name}-h{i}", veth=f"rlbox-{name}-h{i}", address=str(base + i),
                           prefixlen=net.prefixlen, gateway=gateway, dir=f"{folder}/h{i}",
                           devices=devices.get(i, DEVICES[hardware]), driver=drivers.get(i, driver))
                  for i in range(1, hosts + 1))
    return TestbedPlan(name, root.rstrip("/"), str(net), hardware, plans, image, min(nofile, 65536), slurm)


def stand_ins(plan: TestbedPlan, host: HostPlan) -> Path:
    """Write a host's NPU stand-ins (driver tree, npu-smi, the device list) with the simulation's writers."""
    return sim.write_stand_ins(Path(host.dir) / "stand-ins", plan.hardware, host.devices, host.driver,
                               host_index=host.index)
