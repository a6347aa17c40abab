"""What every workload operation did and what the client reported, for the invariant checker."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from airflow_jetstream.client.errors import JetStreamError

#: A workload's own check (plain nats-py) failed after the client's call succeeded: no verdict on the client.
PROBE_FAILED = "probe_failed"
#: Reasons after which the client does not know whether the write happened (a re-send may or may not
#: have landed): the checker accepts "stored once" and "absent" for these, never "partial" or "twice".
UNKNOWN_OUTCOME = frozenset({
    "timeout", "leader_unavailable", "connection_lost", "server_unreachable", "connection_closed",
    "msg_id_in_process", "hung", "batch_abandoned", PROBE_FAILED,
})
#: Phrases with which an error says that nothing was written, making an outcome definite.
NOTHING_STORED = ("nothing of the batch was stored", "nothing was stored", "nothing of it was stored")


@dataclass
class Op:
    """One operation: ``keys`` are the unique payload keys it wrote (in order)."""

    id: str
    workload: str
    start: float
    t0: float = 0.0  # when the run started, for readable offsets
    keys: list[str] = field(default_factory=list)
    end: float = 0.0
    ok: bool = False
    reason: str = ""
    message: str = ""
    definite: bool = False  # a failure that says nothing was written
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.end - self.start

    def succeed(self, **result: Any) -> None:
        self.ok, self.end, self.result = True, time.monotonic(), {**self.result, **result}

    def fail(self, reason: str, message: str, **result: Any) -> None:
        self.ok, self.end, self.reason, self.message = False, time.monotonic(), reason, message
        self.result = {**self.result, **result}
        lowered = message.lower()
        self.definite = reason not in UNKNOWN_OUTCOME or (
            any(p in lowered for p in NOTHING_STORED) and "unless" not in lowered)

    def fail_with(self, exc: JetStreamError, **result: Any) -> None:
        self.fail(exc.reason, str(exc), **result)

    def brief(self) -> str:
        outcome = "ok" if self.ok else f"failed {self.reason}"
        return (f"{self.id} ({self.workload}, {len(self.keys)} msgs, {outcome}, {self.duration:.1f}s "
                f"from +{self.start - self.t0:.0f}s)")


class History:
    """All operations of one run."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.ops: list[Op] = []
        self._counters: dict[str, int] = {}

    def begin(self, workload: str, size: int = 0) -> Op:
        number = self._counters.get(workload, 0) + 1
        self._counters[workload] = number
        op = Op(f"{workload}-{number}", workload, time.monotonic(), self.t0)
        op.keys = [f"{op.id}-{i}" for i in range(size)]
        self.ops.append(op)
        return op


def payload(key: str) -> bytes:
    return json.dumps({"k": key}).encode()


def key_of(data: bytes) -> str | None:
    try:
        return json.loads(data).get("k")
    except (ValueError, AttributeError):
        return None
