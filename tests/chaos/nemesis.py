"""The seeded nemesis: a schedule of faults drawn from one seed, applied one at a time and healed.

Faults (``KINDS``):

- ``kill``: SIGKILL a random node, restart it after 2-8 s (same ports and store);
- ``stop``: SIGSTOP a random node for 5-15 s, then SIGCONT (a stalled server: GC pause, frozen VM);
- ``leader-kill``: SIGKILL the leader of one of the workload streams, restart it after 2-8 s, then
  hand the stream's leadership back to it (a restarted leader rebuilds its state from its store);
- ``partition``: cut a random node off everyone (clients and peers) for 5-15 s;
- ``routes``: cut the stream leader's routes to its peers for 5-15 s while clients still reach it;
- ``kill-two``: SIGKILL two nodes at once (the cluster loses its quorum), restart both after 2-8 s.

Partitions need network namespaces; on loopback they become a SIGSTOP of the same node (said in
the output). After each fault the cluster must be healthy again (bounded) before the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import threading
import time
from dataclasses import dataclass, field

import nats
import nats.errors

from airflow_jetstream.embedded import EmbeddedNatsCluster
from tests.chaos.cluster import signal_node
from tests.chaos.network import Topology

KINDS = ("kill", "stop", "leader-kill", "partition", "routes", "kill-two")
NEEDS_NAMESPACES = ("partition", "routes")
HEAL_TIMEOUT = 90.0


class FaultHalted(Exception):
    """The run is being cleaned up while a fault was held."""


@dataclass
class Fault:
    kind: str
    duration: float
    pick: float  # a seeded number in [0, 1) that chooses the node(s) and stream when the fault starts
    gap: float  # quiet seconds before the fault
    targets: list[str] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0
    note: str = ""

    def describe(self, t0: float) -> str:
        note = f" {self.note}" if self.note else ""
        return f"+{self.start - t0:.0f}s {self.kind} {','.join(self.targets) or '-'} {self.duration:.1f}s{note}"


def schedule(seed: int, count: int, kinds: tuple[str, ...]) -> list[Fault]:
    """``count`` faults drawn from ``kinds`` with the random generator seeded by ``seed``."""
    rng = random.Random(seed)
    faults = []
    for _ in range(count):
        kind = rng.choice(kinds)
        low, high = (2.0, 8.0) if kind in ("kill", "leader-kill", "kill-two") else (5.0, 15.0)
        faults.append(Fault(kind, round(rng.uniform(low, high), 1), rng.random(), round(rng.uniform(1.0, 3.0), 1)))
    return faults


class Nemesis:
    """Applies a schedule to ``cluster`` (and ``topology`` when namespaces exist), recording each fault."""

    def __init__(self, cluster: EmbeddedNatsCluster, topology: Topology | None, streams: list[str]) -> None:
        self.cluster = cluster
        self.topology = topology
        self.streams = streams
        self.done: list[Fault] = []
        self.current: Fault | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.halted = threading.Event()

    def halt(self) -> None:
        """Stop at once (the run is being cleaned up): no fault is started or healed by restarting after this."""
        self.halted.set()

    def _hold(self, seconds: float) -> None:
        if self.halted.wait(seconds):
            raise FaultHalted

    def _node(self, fault: Fault, among: list[str] | None = None) -> str:
        names = among or [n.name for n in self.cluster.nodes]
        return names[int(fault.pick * len(names))]

    def _stream(self, fault: Fault) -> str:
        return self.streams[int(fault.pick * len(self.streams))]

    def _leader(self, fault: Fault) -> str:
        stream = self._stream(fault)
        leader = self.cluster.stream_leader(stream)
        fault.note = f"(leader of {stream})"
        return leader or self._node(fault)

    def _lead_again(self, fault: Fault) -> None:
        """Hand the stream's leadership back to the restarted node (bounded; noted when it fails)."""
        stream, name = self._stream(fault), fault.targets[0]
        assert self.loop is not None
        for _ in range(5):
            self._hold(0)
            self.cluster.wait_healthy(HEAL_TIMEOUT)
            if self.cluster.stream_leader(stream) == name:
                fault.note = f"(leader of {stream}, leads again)"
                return
            asyncio.run_coroutine_threadsafe(self._step_down(stream, name), self.loop).result(30)
            self._hold(1)
        fault.note = f"(leader of {stream}, did not lead again)"

    async def _step_down(self, stream: str, preferred: str) -> None:
        body = json.dumps({"placement": {"preferred": preferred}}).encode()
        with contextlib.suppress(nats.errors.Error, OSError):  # the next round looks at the leader again
            nc = await nats.connect(servers=[n.url for n in self.cluster.nodes], connect_timeout=2,
                                    max_reconnect_attempts=2)
            try:
                await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", body, timeout=5)
            finally:
                await nc.close()

    async def run(self, faults: list[Fault], stop: asyncio.Event | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        for fault in faults:
            if stop is not None and stop.is_set():
                return
            await asyncio.sleep(fault.gap)
            await asyncio.to_thread(self.apply, fault)

    def apply(self, fault: Fault) -> None:
        """Inject ``fault``, keep it for its duration, heal it and wait for a healthy cluster."""
        kind = fault.kind
        if kind in NEEDS_NAMESPACES and self.topology is None:
            fault.note = "(SIGSTOP: no network namespaces)"
            kind = "stop"
        self.current = fault
        fault.start = time.monotonic()
        try:
            if kind in ("kill", "leader-kill", "kill-two"):
                self._kill(fault, kind)
            elif kind == "stop":
                self._stop(fault)
            else:
                self._partition(fault, routes_only=kind == "routes")
            self.cluster.wait_healthy(HEAL_TIMEOUT)
        finally:
            fault.end = time.monotonic()
            self.current = None
            self.done.append(fault)

    def _kill(self, fault: Fault, kind: str) -> None:
        names = [n.name for n in self.cluster.nodes]
        if kind == "kill-two":
            first = self._node(fault)
            fault.targets = [first, names[(names.index(first) + 1) % len(names)]]
        else:
            fault.targets = [self._leader(fault) if kind == "leader-kill" else self._node(fault)]
        for name in fault.targets:
            self.cluster.kill(name)
        self._hold(fault.duration)
        for name in fault.targets:
            self.cluster.node(name).start()
        if kind == "leader-kill":
            self._lead_again(fault)

    def _stop(self, fault: Fault) -> None:
        fault.targets = [self._node(fault)]
        signal_node(self.cluster, fault.targets[0], signal.SIGSTOP)
        try:
            self._hold(fault.duration)
        finally:
            signal_node(self.cluster, fault.targets[0], signal.SIGCONT)

    def _partition(self, fault: Fault, *, routes_only: bool) -> None:
        assert self.topology is not None
        fault.targets = [self._leader(fault) if routes_only else self._node(fault)]
        self.topology.cut(fault.targets[0], routes_only=routes_only)
        try:
            self._hold(fault.duration)
        finally:
            self.topology.heal(fault.targets[0])

    def active_during(self, start: float, end: float, grace: float) -> bool:
        """Whether any fault overlapped ``[start, end]``, each fault counted until ``grace`` s after its heal."""
        faults = [*self.done, *([self.current] if self.current else [])]
        return any(f.start <= end and (f.end or time.monotonic()) + grace >= start for f in faults)
