"""`rlbox testbed up/down/status`: several real hosts on this machine (namespaces, their own
dockerd and sshd, NPU stand-ins) for the production path `rlbox run --cluster`."""

from __future__ import annotations

import json
import resource

import click

from rlbox.cli.common import IntRange, err, out
from rlbox.core.errors import RlboxError
from rlbox.testbed import execute as tb
from rlbox.testbed import plan as tbplan

ROOT = click.option("--root", default=tbplan.DEFAULT_ROOT, show_default=True,
                    callback=lambda ctx, param, value: tbplan.check_root(value),
                    help="Folder holding every testbed's state, engines' data and keys.")
NAME = click.option("--name", default=tbplan.DEFAULT_NAME, show_default=True,
                    callback=lambda ctx, param, value: tbplan.check_name(value),
                    help="The testbed's name (a letter then up to 4 letters/digits): rlbox-NAME-hI namespaces, bridge rlbox-NAME.")


def _hard_nofile() -> int:
    """This machine's hard open-files limit, which every host of a testbed shares (root without
    CAP_SYS_RESOURCE cannot raise it)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 65536 if hard == resource.RLIM_INFINITY else hard


def _note(line: str) -> None:
    err.print(f"rlbox: {line}", markup=False, highlight=False)


@click.group("testbed")
def testbed_group():
    """A cluster in a box: N hosts on this machine, each with its own network namespace and
    address on a bridge, its own Docker engine and sshd, and the NPU stand-ins of an Ascend host
    (/dev/davinci*, the driver's version.info, npu-smi). Not an NPU: one kernel, simulated chips.
    Needs root and iproute2; where that is not possible, rehearse with `rlbox run --sim`.

    \b
    rlbox testbed up --hosts 4 --hardware a3 --image localhost/rlbox/sim:amd64
    rlbox run --cluster /var/lib/rlbox-testbed/tb0/cluster.yaml --smoke-test
    rlbox testbed down
    """


@testbed_group.command("up")
@click.option("--hosts", type=IntRange(1, tbplan.MAX_HOSTS), required=True, help="How many hosts.")
@click.option("--hardware", type=click.Choice(["a2", "a3", "ax"]), required=True, help="The hosts' NPU stand-ins (a3: 16 per host).")
@NAME
@click.option("--subnet", default=tbplan.DEFAULT_SUBNET, show_default=True, help="The hosts' network (host I is .I, the bridge .254): a /24 or larger inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16.")
@ROOT
@click.option("--driver", default=tbplan.DEFAULT_DRIVER, show_default=True, help="Driver version every host reports.")
@click.option("--host-devices", multiple=True, metavar="HOST=N", help="Give host HOST (1-based) N NPUs instead of the hardware's.")
@click.option("--host-driver", multiple=True, metavar="HOST=VERSION", help="Give host HOST another driver version.")
@click.option("--image", help="An image on this machine's engine to load into every host (and name in the cluster file): an image reference, NAME[:TAG][@DIGEST].")
@click.option("--slurm", is_flag=True, help="Also run Slurm (Debian's slurm-wlm): munged on every host, slurmctld on host 1, "
              "slurmd on every host, the NPU stand-ins as GRES npu; the cluster file names host 1 as the login node.")
@click.option("--dry-run", is_flag=True, help="Print every step and process of the bring-up; make nothing.")
def up_cmd(hosts, hardware, name, subnet, root, driver, host_devices, host_driver, image, slurm, dry_run):
    """Bring a testbed up and write its cluster file (printed on stdout).

    A host is up once root logs in to it with the testbed's key; a --root under which sshd
    would refuse that key (a folder above it writable by others, as /tmp) is refused first."""
    plan = tbplan.plan_testbed(hosts=hosts, hardware=hardware, name=name, subnet=subnet, root=root, driver=driver,
                               image=image, host_devices=tuple(host_devices), host_driver=tuple(host_driver),
                               nofile=_hard_nofile(), slurm=slurm)
    if dry_run:
        click.echo(plan.describe(), nl=False)
        return
    state = tb.up(plan, _note, load_image=tb.load_image_by_save)
    _note(f"testbed {name} is up; cluster file: {state.cluster_file}")
    click.echo(state.cluster_file)


@testbed_group.command("down")
@NAME
@ROOT
def down_cmd(name, root):
    """Take a testbed down: no namespace, link, process, mount, cgroup, rule or folder is left.

    What is killed or deleted is what looking proves is the testbed's (processes by their argv,
    namespaces or cgroup; links and namespaces named rlbox-NAME...), never what its record names;
    a record `up` would not have written is one line naming the file and field (exit 2)."""
    tb.down(root, name, _note)


@testbed_group.command("status")
@NAME
@ROOT
@click.option("--json", "as_json", is_flag=True)
def status_cmd(name, root, as_json):
    """Each host: its address, whether its namespaces, engine and sshd answer, its NPUs and driver."""
    rows = tb.status(root, name)
    if as_json:
        click.echo(json.dumps({"testbed": tb.record(root, name), "hosts": rows}, indent=2))
        return
    for r in rows:
        out.print(f"h{r['host']} {r['address']:<15} host {'up' if r['alive'] else 'DOWN'}  engine "
                  f"{'up' if r['engine'] else 'DOWN'}  sshd {'up' if r['sshd'] else 'DOWN'}  "
                  f"{r['devices']} NPUs  driver {r['driver']}  engine socket {r['socket']}")
    if not all(r["alive"] and r["engine"] and r["sshd"] for r in rows):
        raise RlboxError(f"testbed {name}: a host is not fully up (see above)", exit_code=1)


