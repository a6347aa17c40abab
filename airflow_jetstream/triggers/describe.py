"""One human log line per observed state (sources, consumers, ledger runs), for sensors and triggers alike."""

from __future__ import annotations

from typing import Any


def human_duration(seconds: float) -> str:
    """``0.25`` -> ``"250 ms"``, ``42.0`` -> ``"42.0 s"``, ``5400`` -> ``"90 min"``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 600:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.0f} min"


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return f"{error.get('description') or error.get('message') or error} (err_code {error.get('err_code')})"
    return str(error)


def describe_source(status: dict[str, Any]) -> str:
    """``AGG <- RAW: not caught up (lag 120 message(s), 30 pending on JS_SRC_x, last active 80 ms ago)``."""
    active = status.get("active")
    seen = "never active" if active is None or active < 0 else f"last active {human_duration(active / 1e9)} ago"
    kind = "mirror of" if status.get("mirror") else "<-"
    parts = [f"lag {status.get('lag')} message(s)"]
    if status.get("consumer_num_pending") is not None:
        parts.append(f"{status['consumer_num_pending']} pending on {status.get('consumer')}")
    if status.get("consumer_num_ack_pending"):
        parts.append(f"{status['consumer_num_ack_pending']} in flight (delivered, not yet confirmed stored)")
    parts.append(seen)
    line = (f"{status.get('stream')} {kind} {status.get('source')}: "
            f"{'caught up' if status.get('caught_up') else 'not caught up'} ({', '.join(parts)})")
    if status.get("error"):
        line += f"; source error: {_error_text(status['error'])}"
    if status.get("origin_left_behind"):
        line += (f"; {status.get('source')} still holds {status['origin_left_behind']} message(s) its consumer will "
                 "not deliver again (docs/sourcing.md: Messages left in a WorkQueue origin)")
    return line


def describe_consumer(status: dict[str, Any]) -> str:
    """``ORDERS/billing: not drained (12 pending, 3 awaiting ack, 1 redelivered, acked up to stream seq 88)``."""
    floor = (status.get("ack_floor") or {}).get("stream_seq")
    line = (f"{status.get('stream')}/{status.get('consumer')}: {'drained' if status.get('drained') else 'not drained'} "
            f"({status.get('num_pending')} pending, {status.get('num_ack_pending')} awaiting ack, "
            f"{status.get('num_redelivered')} redelivered, acked up to stream seq {floor})")
    return line + (" [paused]" if status.get("paused") else "")


def describe_progress(status: dict[str, Any]) -> str:
    """``run 'R': 7/10 batch(es) reached consumed (at least 1 expected; published 2, ...)``."""
    states = ", ".join(f"{name} {count}" for name, count in (status.get("states") or {}).items())
    line = (f"run {status.get('run_id')!r}: {status.get('reached')}/{status.get('batches')} batch(es) reached "
            f"{status.get('awaited')} (at least {status.get('min_batches')} expected; {states})")
    reaped = status.get("reaped") or {}
    if reaped.get("returned") or reaped.get("failed"):
        line += f"; reaped expired claims: returned {reaped.get('returned')}, failed {reaped.get('failed')}"
    return line
