"""Image delivery's progress: per receiving node its state (receiving, loading, loaded,
verified, failed) with the bytes sent and the rate, as a live table on a terminal and as plain
lines elsewhere (a state change, and every quarter of the image sent)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rlbox.delivery import plan as delivery
from rlbox.delivery.plan import DeliveryPlan

Echo = Callable[[str], None]




@dataclass
class NodeState:
    state: str = "waiting"
    detail: str = ""


@dataclass
class Progress:
    plan: DeliveryPlan
    echo: Echo
    tty: bool = False
    sent: int = 0
    started: float = field(default_factory=time.monotonic)
    nodes: dict[str, NodeState] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _live: object = None
    _next_mark: float = 0.25

    def __post_init__(self):
        self.nodes = {t.name: NodeState() for t in self.plan.targets}

    def start(self) -> None:
        if self.tty:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._table(), console=Console(stderr=True), refresh_per_second=4,
                              get_renderable=self._table, transient=False)
            self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def set(self, name: str, state: str, detail: str = "") -> None:
        with self._lock:
            node = self.nodes.setdefault(name, NodeState())
            node.state, node.detail = state, detail
        if not self.tty:
            self.echo(f"{name}: {state}" + (f" ({detail})" if detail else ""))

    def add(self, n: int) -> None:
        self.sent += n
        expected = self.plan.size or 1
        if not self.tty and self.sent >= self._next_mark * expected:
            self._next_mark += 0.25
            self.echo(f"sent {delivery.human(self.sent)} ({self.rate()})")

    def rate(self) -> str:
        seconds = max(time.monotonic() - self.started, 1e-3)
        return f"{delivery.human(self.sent / seconds)}/s"

    def _table(self):
        from rich.table import Table

        table = Table(box=None, show_header=True, header_style="bold")
        for col in ("node", "state", "bytes", "rate", ""):
            table.add_column(col)
        with self._lock:
            for name, node in self.nodes.items():
                moving = node.state in ("receiving", "pulling")
                table.add_row(name, node.state, delivery.human(self.sent) if node.state == "receiving" else "",
                              self.rate() if moving and node.state == "receiving" else "", node.detail)
        return table


