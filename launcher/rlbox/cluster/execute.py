"""Carrying out a RunPlan: containers on every node, Ray readiness, the job, teardown.

Thin by design: every decision is already in the plan. What this adds is order, parallelism,
and cleanup: any failure or Ctrl-C removes this run's containers (by label) on every node and
the simulation network, so nothing is left half-started.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from rlbox.cluster import bringup, driver, jobs, probe, ray, sharing, sim, watch
from rlbox.cluster.ending import CLEANED, NOTHING, Ending, last_line, signal_name
from rlbox.core import engine
from rlbox.core.errors import RlboxError
from rlbox.cluster.hosts import Call, Node, Rounds, awaited, connect_all, first_error, on_every, silent
from rlbox.cluster.plan import LABEL_RUN, LABEL_RUN_ID, NodePlan, RunPlan
from rlbox.cluster.state import STATE_FILE, Phase, RunState, record_run_id, restart_line
from rlbox.verl import job as verl_job

Echo = Callable[[str], None]


@dataclass
class Cluster:
    """A plan being carried out on connected nodes."""

    plan: RunPlan
    nodes: list[Node]
    echo: Echo
    dashboard: str | None = None
    addresses: dict[int, str] = field(default_factory=dict)  # node index -> address, once started
    reported: set[int] = field(default_factory=set)  # nodes whose address is the one they reported
    phases: bringup.Phases = field(default_factory=bringup.Phases)  # where the bring-up's seconds went
    reads: Rounds = field(default_factory=bringup.address_reads)  # the nodes' address lines, read beside the watch
    ids: dict[int, str] = field(default_factory=dict)  # node index -> its container's id, once created
    _torn_down: bool = field(default=False, repr=False)

    # -- bring-up -------------------------------------------------------------------------
    def preflight(self, replace: bool) -> None:
        """Image present everywhere; no live run of the same name (unless --replace, in which
        case it is removed later, by `clear`, once every check has passed)."""
        from docker.errors import ImageNotFound

        def check(pair):
            node_plan, node = pair
            try:
                image_id = node.client.images.get(self.plan.image).id
            except ImageNotFound:
                raise RlboxError(f"{node_plan.host.name}: image {self.plan.image} is not present; "
                                 f"{self.plan.missing_image_hint()}") from None
            boxes = node.client.containers.list(all=True, ignore_removed=True, filters={"label": f"{LABEL_RUN}={self.plan.run}"})
            live = [c for c in boxes if c.status in ("running", "restarting", "created", "paused")]
            if live and not replace:
                raise RlboxError(
                    f"{node_plan.host.name}: run '{self.plan.run}' is already live ({live[0].name}); "
                    "stop it (rlbox stop --name ...), pick another --name, or pass --replace"
                )
            return image_id

        ids, errors = on_every(check, list(zip(self.plan.nodes, self.nodes)))
        if errors:
            raise errors[0]
        odd = bringup.image_skew(self.plan, ids)
        if odd:
            raise RlboxError(odd)

    def clear(self) -> None:
        """Remove what an earlier run of this name left (exited, or live under --replace)."""
        remove_run(self.nodes, self.plan.run, self.plan.network.name if self.plan.network else None,
                   keep_claims_of=self.plan.run_id)

    def start(self) -> None:
        if self.plan.network:
            subnet = sim.create_network(self.nodes[0].client, self.plan.network, self.plan.run, self.plan.run_id)
            self.echo(f"simulation network {self.plan.network.name} on {subnet}")

        def start_one(pair):
            node_plan, node = pair
            try:
                box = node.client.containers.create(**node_plan.container.docker_py())
            except Exception as err:  # docker.errors.APIError and friends
                raise bringup.start_error(node_plan, err) from None
            self.ids[node_plan.index] = box.id
            try:
                box.start()
                if self.plan.network:  # the engine gave the address
                    box.reload()
                    self.addresses[node_plan.index] = box.attrs["NetworkSettings"]["Networks"][self.plan.network.name]["IPAddress"]
            except Exception as err:  # noqa: BLE001
                raise bringup.start_error(node_plan, err) from None
            self.echo(f"node{node_plan.index} {node_plan.role:6} started on {node_plan.host.name} ({node_plan.npus} NPUs)")

        pairs = list(zip(self.plan.nodes, self.nodes))
        if self.plan.network:  # a simulated worker resolves the head by its container's name: there once it runs
            start_one(pairs.pop(0))
        _, errors = on_every(start_one, pairs)
        if errors:
            raise errors[0]

    def connect_dashboard(self) -> str:
        self.dashboard = self.nodes[0].dashboard(self.plan.head, self.plan.ports.dashboard, self.plan.sim)
        return self.dashboard

    def watcher(self) -> watch.Watch:
        """The node watch of this cluster: each container, and Ray's row of the address each node reported."""
        return watch.Watch(watch.expected_of(self.plan, self.addresses), [n.container.name for n in self.plan.nodes],
                           self.nodes, self.dashboard)

    def learn_addresses(self, settle: bool = False) -> None:
        """The address each node said it starts Ray on (its first output line): Ray's node table carries it,
        not the host's name. The nodes not heard from yet are read at once (bringup.addresses_said)."""
        todo = [(p, n) for p, n in zip(self.plan.nodes, self.nodes) if p.index not in self.reported]
        said = bringup.addresses_said(self.reads, todo, settle)
        self.addresses.update(said)
        self.reported.update(said)

    def wait_ready(self, timeout: float) -> None:
        """Until every NPU has joined Ray. A node whose container stops, freezes or vanishes
        meanwhile is lost (NodeLost: a restart may follow)."""
        looking = self.watcher()
        tries: dict[tuple[int, str | None], int] = {}  # by node and Ray's words
        last = [float("-inf")]
        gate = bringup.gate_for(list(zip(self.plan.nodes, self.nodes)), self.echo, self.ids)
        pacing = gate.line()
        if pacing:
            self.echo(pacing)

        def lost_node() -> None:  # one look at the engines a watch period (or once an engine's silence is due), not a poll
            now = looking.clock()
            if now - last[0] < looking.every and not looking.overdue(now):
                return
            last[0] = now
            boxes = looking.boxes()  # first: an engine's silence counts from this look's call
            for i, (node, box) in enumerate(zip(looking.expected, boxes)):
                why = watch.gave_up(box)
                if watch.start_again(node, box, tries.get((i, why), 0)):
                    tries[i, why] = tries.get((i, why), 0) + 1
                    boxes[i] = self.start_again(i, tries[i, why], why, box)
            loss = watch.judge(looking.expected, boxes, None)
            if loss is not None:
                # judge names the head first: when it gave up, the loss is its own
                head = next((b for e, b in zip(looking.expected, boxes) if watch.head_gave_up(e, b)), None)
                raise watch.HeadGaveUp(loss, head) if head is not None else watch.NodeLost(loss)
            gate.give()  # the workers Ray's table now lets start (one started again above keeps its go file)
            self.learn_addresses()

        lost_node()  # the first look before anything else is waited for: an engine silent from the start is
        # named ENGINE_PATIENCE after it, not after the first reads and gos have had their LOOK_WAIT too
        expected = {e.label: e.address for e in self.watcher().expected}

        def progress(nodes_up: int, npus: int, total: int) -> None:
            self.echo(f"ray: {nodes_up}/{len(self.plan.nodes)} nodes, {npus}/{total} NPUs")
            gate.give(registered=nodes_up - 1)
            for phase, done in (("head", nodes_up >= 1), ("workers", nodes_up >= len(self.plan.nodes))):
                if done and phase not in marked:
                    marked.add(phase)
                    self.phases.mark(phase)

        marked: set[str] = set()
        ray.wait_for_npus(self.dashboard, expected, self.plan.total_npus, timeout, progress, lost_node)
        self.phases.mark("NPUs")
        self.learn_addresses(settle=True)

    def start_again(self, index: int, attempt: int, why: str, box: watch.Box) -> watch.Box:
        """Start a worker's exited container again (Ray's start-up gave up: ``why``, watch.gave_up); what then."""
        node_plan, node = self.plan.nodes[index], self.nodes[index]
        self.echo(f"{node_plan.label}: Ray's start-up gave up ({watch.said_when_gave_up(why, box)}); "
                  f"starting it again ({attempt}/{watch.budget(why)})")
        call = Call(lambda _: node.client.containers.get(node_plan.container.name).start(), None, time.monotonic())
        if not call.done.wait(watch.LOOK_WAIT):  # its engine slow or silent: the watch's next look tells which
            return watch.Box(watch.UNREACHABLE)
        if call.error is not None:  # gone meanwhile, or its engine: the watch names it
            self.echo(f"{node_plan.label}: cannot start it again: {engine.reason(call.error)}")
            return watch.Box("exited", None, watch.RAY_START_TIMED_OUT)
        return watch.Box("running")

    # -- teardown -------------------------------------------------------------------------
    def remove_own(self, keep_claims: bool = False) -> None:
        """Remove this run id's containers, claims and network, nothing of another run of the
        same name (one that took the name over with --replace keeps everything it holds).
        ``keep_claims``: a restart's teardown, the run's NPUs, ports and name still its own."""
        remove_run(self.nodes, self.plan.run, self.plan.network.name if self.plan.network else None,
                   run_id=self.plan.run_id, claims=not keep_claims)

    def take_down_to_come_up_again(self) -> None:
        """A restart's (or a second bring-up's) teardown: the containers go, the claims stay (no other
        run takes the NPUs, ports or name meanwhile), what the nodes reported is forgotten."""
        self.remove_own(keep_claims=True)
        self.addresses.clear()
        self.reported.clear()
        self.reads, self.ids = bringup.address_reads(), {}  # a read still out from before is not this bring-up's

    def teardown(self) -> None:
        if self._torn_down:
            return
        self._torn_down = True
        try:
            self.remove_own()
        finally:  # a node that cannot be cleaned (its engine unreachable) is said; no tunnel is left behind
            for node in self.nodes:
                node.close()


def _drop_name(plan: RunPlan, nodes: list[Node]) -> None:
    """Give back this run's name claim (only this run id's) after a failed claim."""
    for box in nodes[0].client.containers.list(all=True, ignore_removed=True, filters={"label": f"{sharing.LABEL_CLAIM_ID}={plan.run_id}"}):
        engine.remove_quietly(box)


def remove_run(nodes: list[Node], run: str, network: str | None, keep_claims_of: str | None = None,
               run_id: str | None = None, claims: bool = True) -> int:
    """Remove every container labelled with this run on every node (only run id ``run_id``'s
    when given, with its claims unless not ``claims``), then the sim network (only ``run_id``'s,
    when given)."""
    label = f"{LABEL_RUN_ID}={run_id}" if run_id else f"{LABEL_RUN}={run}"

    def remove(node: Node) -> set[str]:
        try:  # an engine gone away (or silent: a cut host holds a call until ssh gives up): say which, go on
            if silent(node, TEARDOWN_PATIENCE):
                raise RuntimeError(f"its engine has not answered for {TEARDOWN_PATIENCE:.0f} s")
            boxes = node.client.containers.list(all=True, ignore_removed=True, filters={"label": label})
        except Exception as err:  # noqa: BLE001
            raise RlboxError(f"{node.host.name}: cannot list run {run}'s containers ({engine.reason(err)}); "
                             f"rerun `rlbox stop --name {run}`") from None
        boxes = [b for b in boxes if b.labels.get(LABEL_RUN) == run]
        for box in boxes:  # nodes may share one engine: a box may be gone already
            engine.remove_quietly(box)
        if run_id:
            if claims:
                sharing.release_own(node.client, run, run_id)
        else:
            sharing.release(node.client, run, keep_claims_of)
        return {box.id for box in boxes}

    results, errors = on_every(remove, nodes)
    removed = len(set().union(*results))
    if errors:
        raise first_error(errors)
    if network and nodes:
        # only a network carrying this run's label: a name from state.json alone is never enough
        for net in nodes[0].client.networks.list(names=[network], filters={"label": f"{LABEL_RUN}={run}"}):
            if net.name != network or (net.attrs.get("Labels") or {}).get(LABEL_RUN) != run:
                continue  # the engine matches names by substring
            if run_id and (net.attrs.get("Labels") or {}).get(LABEL_RUN_ID) not in (run_id, None):
                continue  # another run of this name made it (it took the name over)
            try:
                net.remove()
            except Exception:  # noqa: BLE001 - still in use: removed with its last container
                pass
    return removed


# ---------------------------------------------------------------------------------------------
NODE_LOST_EXIT = 2  # a lost node ends `rlbox run` with this code, and state.json records it
TEARDOWN_PATIENCE = 10.0  # seconds an engine's ping may go unanswered before teardown leaves its node


@dataclass
class Outcome:
    exit_code: int
    status: str
    ready_seconds: float
    log_path: Path | None
    ended: str = ""  # how the job ended, in words (jobs.ended)


def execute(
    plan: RunPlan,
    *,
    run_dir: Path, echo: Echo, emit: Echo,
    timeout: float = 300, replace: bool = False, detach: bool = False, keep: bool = False,
    bring_up_only: bool = False, max_restarts: int = 0, tty: bool = False,
    before: Callable[[list[Node]], None] | None = None,
    on_failure: Callable[[list[Node], Path], str | None] | None = None,
    deliver: Callable[..., object] | None = None,
) -> Outcome:
    """Carry out the plan. Tears everything down on failure, Ctrl-C, SIGTERM, or at the end.

    While the job runs every node is watched (watch.Watch); a lost node ends the run naming it,
    or, with ``max_restarts``, the cluster is torn down, checked (``before``) and brought up
    again and the job resubmitted (jobs.for_restart); so is a failed job whose triage
    (``on_failure``) returns a retryable cause."""
    state_file = run_dir / STATE_FILE
    run = _Run(plan, RunState(plan.as_dict(), Phase.STARTING), state_file, echo)
    log_path = run_dir / f"{plan.run_id}.log"
    started = time.monotonic()
    phases = bringup.Phases()
    nodes = connect_all(tuple(n.host for n in plan.nodes))
    cluster = Cluster(plan, nodes, echo, phases=phases)
    phases.mark("ssh")
    cleanup = False  # nothing of ours exists until preflight has passed
    client = submission = ending = None  # ending: what ended the run; a failed teardown never hides it
    try:
        with engine.sigterm_as_interrupt():
            try:
                # the image on every node: delivered where missing; a node holding another image
                # under the name is refused (rlbox distribute --force replaces it)
                # (``deliver``: rlbox.delivery.execute.ensure, given by the caller, a layer above)
                if deliver is not None:
                    deliver(plan.image, tuple(n.host for n in plan.nodes), echo, missing_hint=plan.missing_image_hint(),
                            tty=tty, held=bringup.held_images(plan.image, nodes))
                cluster.preflight(replace)  # refuses a live run of this name before anything else starts
                phases.mark("image")
                if plan.sim_files:
                    sim.write_hosts(plan)
                if before is not None:  # checks that need the engines but must pass before anything starts
                    before(nodes)
                phases.mark("pre-flight")
                sharing.claim_name(plan, nodes, replace)  # of two starts of one name at once, one goes on
                try:
                    cluster.clear()  # only now: a failed check leaves a --replace'd run alone
                    sharing.claim(plan, nodes)  # atomic: NPUs and ports; a loser touches nothing else
                except BaseException:
                    _drop_name(plan, nodes)
                    raise
                cleanup = True
                run.save()
                driver.mark(run_dir)  # a kill -9 of this process is told by `rlbox status` from it
                phases.mark("claims")
                job, attempt, again = plan.job, 0, 0
                while True:
                    try:
                        cluster.start()
                        sharing.end_start(plan, nodes)  # held until the containers exist: a --replace after it sees them
                        phases.mark("containers")
                        cluster.connect_dashboard()
                        cluster.wait_ready(timeout)
                    except watch.NodeLost as lost:  # a node lost while Ray comes up (the head too) is a loss
                        if isinstance(lost, watch.HeadGaveUp) and again < watch.START_AGAIN:
                            again += 1  # Ray's start-up timed out on the head: no job ran, no restart is spent
                            echo(f"{lost.loss.label}, the Ray head: Ray's start-up gave up ({lost.said()}); "
                                 f"bringing the cluster up again ({again}/{watch.START_AGAIN})")
                            cluster.take_down_to_come_up_again()
                            continue
                        cause = _loss(lost, run, nodes, attempt, max_restarts)
                    else:
                        ready = time.monotonic() - started
                        echo(f"cluster ready: {len(plan.nodes)} nodes, {plan.total_npus} NPUs in {ready:.1f} s")
                        echo(phases.line())
                        run.advance(Phase.READY, ready_seconds=round(ready, 2), log=str(log_path),
                                    addresses={str(k): v for k, v in sorted(cluster.addresses.items())})
                        if bring_up_only or job is None:
                            cleanup = not keep
                            return Outcome(0, "READY", ready, None)
                        client = jobs.JobsClient(cluster.dashboard)
                        probe.check(client, plan, job, attempt, echo)  # every node's NPUs as the job will see them
                        submission = client.submit(job)
                        echo(f"job {submission} submitted; log: {log_path}")
                        run.advance(Phase.RUNNING, submission_id=submission)
                        if detach:
                            cleanup = False
                            return Outcome(0, "RUNNING", ready, log_path)
                        try:
                            info = _follow(client, submission, cluster, log_path, emit, run, echo, append=attempt > 0)
                        except watch.NodeLost as lost:
                            cause = _loss(lost, run, nodes, attempt, max_restarts)
                        else:
                            code = jobs.exit_code(info)
                            status = info.get("status", "UNKNOWN")
                            ended = jobs.ended(info)
                            echo(f"job {submission} {status}" + (f" (exit {code})" if code else "")
                                 + (f": {ended.split(': ', 1)[1]}" if ": its driver was" in ended else ""))
                            run.advance(Phase.FINISHED, status=status, exit_code=code,
                                        reason=f"job {ended}" if code else None)
                            cause = None
                            if status == "FAILED" and on_failure is not None:  # while the containers still exist
                                cause = guarded(on_failure, nodes, log_path, echo=echo)
                            if cause is None or attempt >= max_restarts:
                                if cause is not None:
                                    echo(f"no restart left ({attempt}/{max_restarts} used) for: {cause}")
                                cleanup = not keep
                                return Outcome(code, status, ready, log_path, ended)
                    attempt += 1
                    job = jobs.for_restart(plan.job, attempt)
                    client = submission = None
                    run.restart(attempt, max_restarts, cause, echo)
                    cluster.take_down_to_come_up_again()
                    if before is not None:  # the pre-flight checks again, on every node
                        before(nodes)
                    started = time.monotonic()
            except KeyboardInterrupt as interrupt:
                engine.ignore_interrupts()
                code = engine.exit_code_of(interrupt)
                echo("interrupted: stopping the job and tearing down every node")
                if client and submission:
                    try:
                        client.stop(submission)
                    except RlboxError:
                        pass
                if cleanup:
                    run.interrupted(code)
                raise Ending("interrupted", exit_code=code) from None
            except OSError as err:  # the runs dir full or read-only; requests' errors are OSErrors too
                what = f"cannot write {err.filename}: {err.strerror}" if err.filename else engine.reason(err)
                if cleanup:
                    run.failed("FAILED", 2, what)
                raise Ending(f"run '{plan.run}' failed: {what}", tail=run.unsaved()) from None
            except RlboxError as err:
                if cleanup:
                    if run.record.phase is not Phase.FINISHED:
                        run.failed("FAILED", err.exit_code, str(err))
                    taken = None if isinstance(err, Ending) and err.takeover_asked else _taken_over_text(plan, nodes)
                    if taken:
                        raise taken.with_tail(run.unsaved()) from None
                if run.unsaved():
                    raise (err.with_tail(run.unsaved()) if isinstance(err, Ending)
                           else RlboxError(str(err) + run.unsaved(), exit_code=err.exit_code)) from None
                raise
    except KeyboardInterrupt as interrupt:  # one that came while an end was being said (a takeover check waits)
        engine.ignore_interrupts()
        code = engine.exit_code_of(interrupt)
        if cleanup and run.record.phase is not Phase.FINISHED:
            run.interrupted(code)
        said = interrupt.__context__
        ending = Ending(f"{said}; interrupted" if isinstance(said, RlboxError) else "interrupted", exit_code=code)
        raise ending from None
    except BaseException as err:
        ending = err
        raise
    finally:
        with engine.shielded():
            driver.unmark(run_dir)
            if cleanup:
                try:
                    cluster.teardown()
                except RlboxError as gone:  # noqa: B012 - the run's last line: its cause, then this
                    raise last_line(ending, gone) from None
                if state_file.exists():
                    run.advance(Phase.REMOVED)
            else:
                for node in nodes:
                    node.close()
            if isinstance(ending, Ending):  # noqa: B012 - only now can the line say what the teardown did
                raise ending.completed(cleanup) from None
            if isinstance(ending, RlboxError):  # its line unchanged; what the teardown did noted for a caller's line
                ending.cleanup = CLEANED if cleanup else NOTHING


def _taken_over_text(plan: RunPlan, nodes: list[Node]) -> Ending | None:
    """The end of a run whose name another `rlbox run --replace` holds now, if one does."""
    asked = Call(lambda _: sharing.holder_of_name(plan, nodes), None, time.monotonic())
    if not awaited(asked, nodes[0], watch.ENGINE_PATIENCE) or asked.error is not None:
        return None  # the head's engine silent or gone: not a takeover we can tell
    holder = asked.result
    if holder and holder != plan.run_id:
        return Ending(f"run '{plan.run}' (id {plan.run_id}) was taken over by another `rlbox run --replace --name "
                      f"{plan.run}` (run id {holder})", cleaned="this one removed only its own containers and claims",
                      partly="this one removed only its own containers and claims, on the nodes it could reach")
    return None


def _loss(lost: watch.NodeLost, run: "_Run", nodes: list[Node], attempt: int, max_restarts: int) -> str:
    """A lost node: said; the end of the run when another --replace took it over or no restart
    is left (recorded, raised); else the cause of the next restart."""
    cause = str(lost)
    if not lost.named:
        run.echo(f"lost: {cause}")
    if not (lost.loss.silent and lost.loss.role == "head"):  # the name's holder is asked of the head's engine
        _taken_over(run.plan, nodes)
    if attempt >= max_restarts:
        end = run.lost(cause, attempt)
        end.takeover_asked = True  # asked just now, or the head's engine silent: not asked again before teardown
        raise end from None
    return cause


def _taken_over(plan: RunPlan, nodes: list[Node]) -> None:
    """No restart for a run that another --replace took over: it ends, saying so."""
    taken = _taken_over_text(plan, nodes)
    if taken:
        taken.takeover_asked = True
        raise taken


@dataclass
class _Run:
    """The run's record as it changes (saved at every change)."""

    plan: RunPlan
    record: RunState
    path: Path
    echo: Echo = print
    save_error: str | None = None  # why the record could not be written (said once, and in the last line)
    saved: bool = False

    def save(self) -> None:
        """Write the record; a failure to (a full runs dir) is said once and kept for the last line.
        Once another run of the name (a --replace) has written its own record there, never again."""
        if self.saved and record_run_id(self.path) not in (self.plan.run_id, None):
            return
        self.saved = True
        try:
            self.record.save(self.path)
        except OSError as err:
            if self.save_error is None:
                self.save_error = err.strerror or str(err)
                self.echo(f"warning: cannot write {self.path} ({self.save_error})")
        else:
            self.save_error = None

    def unsaved(self) -> str:
        return f"; {self.path} could not be written ({self.save_error})" if self.save_error else ""

    def failed(self, status: str, code: int, reason: str) -> None:
        self.advance(Phase.FINISHED, status=status, exit_code=code, reason=reason)

    def interrupted(self, code: int) -> None:  # code: 128 + the signal's number
        self.failed("INTERRUPTED", code, f"interrupted by {signal_name(code - 128)}")

    def lost(self, cause: str, attempt: int) -> Ending:
        """A node lost with no restart left: recorded, and the error that ends the run."""
        self.advance(Phase.FINISHED, status="NODE_LOST", exit_code=NODE_LOST_EXIT, lost=cause, reason=cause)
        return Ending(f"run '{self.plan.run}' failed: {cause}" + (f" (after {attempt} restart(s))" if attempt else ""),
                      exit_code=NODE_LOST_EXIT)

    def advance(self, phase: Phase, **changes) -> None:
        self.record = self.record.advance(phase, **changes)
        self.save()

    def restart(self, attempt: int, of: int, cause: str, echo: Echo) -> None:
        entry = {"attempt": attempt, "of": of, "cause": cause, "resumed_step": None}
        self.advance(Phase.RESTARTING, restarts=(*(self.record.restarts or ()), entry), status=None, exit_code=None)
        echo(restart_line(entry) + ": tearing down, checking every node, bringing the cluster up again")

    def resumed(self, step: int, echo: Echo) -> None:
        restarts = list(self.record.restarts or ())
        if restarts and restarts[-1].get("resumed_step") is None:
            restarts[-1] = restarts[-1] | {"resumed_step": step}
            self.advance(self.record.phase, restarts=tuple(restarts))
            echo(restart_line(restarts[-1]))


def _follow(client: jobs.JobsClient, submission: str, cluster: Cluster, log_path: Path, emit: Echo, run: _Run,
            echo: Echo, *, append: bool) -> dict:
    """Stream the job's log to the terminal and the log file while watching every node."""
    watcher = cluster.watcher()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    looking = [append]  # after a restart: until verl says the step it resumed from
    try:
        with log_path.open("a" if append else "w", encoding="utf-8") as log:
            def both(text: str) -> None:
                log.write(text)
                log.flush()
                emit(text)
                if looking[0]:
                    step = verl_job.resumed_step(text)
                    if step is not None:
                        looking[0] = False
                        run.resumed(step, echo)

            def tick() -> None:  # a lost node is named at once; the rest of the log is read after
                try:
                    watcher.check()
                except watch.NodeLost as lost:
                    echo(f"lost: {lost}")
                    lost.named = True
                    raise

            try:
                return client.follow(submission, both, tick=tick, stop_on_loss=True)
            except jobs.LostContact as lost:
                watcher.check(force=True)  # a lost head is named as such
                raise Ending(str(lost), exit_code=lost.exit_code) from None
    except OSError as err:  # the log file cannot be written (a full runs dir): name it
        if isinstance(err, requests.RequestException) or err.filename:
            raise
        raise OSError(err.errno, err.strerror, str(log_path)) from None


def guarded(hook: Callable[[list[Node], Path], str | None], nodes: list[Node], log_path: Path, *,
            echo: Echo) -> str | None:
    """Run a post-failure hook (the triage) so that nothing it does, fails or is interrupted
    with, changes what follows: the job's exit code and the teardown. A failure is one line.
    What it returns (a retryable cause, or None) is passed on."""
    try:
        return hook(nodes, log_path)
    except KeyboardInterrupt:
        engine.ignore_interrupts()
        echo("triage interrupted; tearing down")
        return None
    except Exception as err:  # noqa: BLE001
        reason = " ".join(str(err).split())[:300] or type(err).__name__
        echo(f"warning: triage failed ({reason}); the job's own log: {log_path}")
        return None
