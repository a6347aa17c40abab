"""How :func:`~airflow_jetstream.client.reading.consume.consume` reads and reacts to failures, checked without
a connection (operators check them when a DAG file is parsed)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import cast

from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import InvalidRequestError

#: Seconds before a failed message is redelivered, by delivery count (the last one repeats).
DEFAULT_NAK_DELAY: tuple[float, ...] = (1.0, 5.0, 30.0, 60.0)
DEFAULT_ACK_WAIT = "5m"

Duration = float | int | str | timedelta


@dataclass
class ConsumeOptions:
    """How much to read and how to react to failures (validated on construction)."""

    per_batch: bool = False
    max_messages: int | None = None
    batch_size: int = 100
    fetch_timeout: Duration = 5.0
    nak_delay: Duration | Sequence[Duration] = DEFAULT_NAK_DELAY
    term_on: tuple[type[BaseException], ...] = ()
    nak_delays: tuple[float, ...] = field(init=False)
    fetch_timeout_seconds: float = field(init=False)

    def __post_init__(self) -> None:
        for name in ("max_messages", "batch_size"):
            value = getattr(self, name)
            if value is None and name == "max_messages":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequestError(f"{name} must be a whole number >= 1, got {value!r}", reason="invalid_option")
        self.fetch_timeout_seconds = to_seconds(self.fetch_timeout, field="fetch_timeout")
        if self.fetch_timeout_seconds <= 0:
            raise InvalidRequestError("fetch_timeout must be more than 0 seconds", reason="invalid_option")
        delays = self.nak_delay if isinstance(self.nak_delay, (list, tuple)) else [cast(Duration, self.nak_delay)]
        self.nak_delays = tuple(to_seconds(d, field="nak_delay") for d in delays) or (0.0,)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in self.term_on):
            raise InvalidRequestError(f"term_on must hold exception classes, got {self.term_on!r}",
                                      reason="invalid_option")

    def delay_for(self, delivered: int) -> float:
        """The nak delay of a message delivered ``delivered`` times."""
        return self.nak_delays[min(max(delivered, 1), len(self.nak_delays)) - 1]
