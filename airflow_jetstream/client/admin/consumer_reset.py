"""Consumer reset (nats-server 2.14+): back to the ack floor, or to a stream sequence or time, for replays."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from airflow_jetstream.client import metrics, server_features
from airflow_jetstream.client.admin.consumers import consumer_info, find_consumer
from airflow_jetstream.client.admin.streams import first_seq_at_or_after
from airflow_jetstream.client.errors import (
    ConsumerNotFoundError,
    ConsumerResetError,
    InvalidRequestError,
    LeaderUnavailableError,
)
from airflow_jetstream.client.times import parse_time, to_rfc3339

if TYPE_CHECKING:
    from airflow_jetstream.client.connection import JetStreamConnection

log = logging.getLogger(__name__)

#: Deliver policies whose consumers cannot be reset to a given sequence (server error 10204).
NO_SEQ_RESET_POLICIES = ("last", "new", "last_per_subject")


def _reset_seq_arg(seq: Any) -> int | None:
    if seq is None:
        return None
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise InvalidRequestError(f"seq must be a positive stream sequence (int), got {seq!r}", reason="invalid_seq")
    if seq < 1:
        raise InvalidRequestError(
            f"seq must be >= 1, got {seq}; leave it unset to reset to the ack floor", reason="invalid_seq"
        )
    return seq


async def reset_consumer(conn: JetStreamConnection, stream: str, name: str, *, seq: int | None = None,
                         time: datetime | str | None = None) -> dict[str, Any]:
    """Reset a consumer's delivery state.

    - neither ``seq`` nor ``time``: back to the ack floor (redeliver what is pending);
    - ``seq``: the next message delivered is the first with stream sequence >= ``seq``;
    - ``time``: same, with the first sequence stored at or after ``time``.

    The consumer is looked up first (the server never answers a reset of an unknown consumer),
    and resets the deliver policy forbids are refused locally with :class:`ConsumerResetError`.
    Returns ``{"stream", "consumer", "reset_seq", "delivered", "ack_floor", "num_pending",
    "num_ack_pending", "requested_seq", "requested_time"}``.
    """
    if seq is not None and time is not None:
        raise InvalidRequestError("give either seq or time for a consumer reset, not both", reason="invalid_reset")
    seq = _reset_seq_arg(seq)
    requested_time = to_rfc3339(time) if time is not None else None
    server_features.require(conn, server_features.CONSUMER_RESET)
    info = await consumer_info(conn, stream, name)
    config = info["config"]
    policy = config.get("deliver_policy", "all")
    where = f"consumer {name!r} on stream {stream!r}"
    if config.get("ack_policy") == "flow_control" and config.get("deliver_subject") and not info.get("paused"):
        log.warning("%s feeds a durable source and is not paused: after a reset while messages arrive, "
                    "nats-server can drop some from the aggregate; pause it first (docs/sourcing.md, "
                    "'A server defect')", where)
    if (seq is not None or time is not None) and policy in NO_SEQ_RESET_POLICIES:
        raise ConsumerResetError(
            f"{where} has deliver_policy {policy!r}: it can only be reset to its ack floor (no seq/time); "
            "use a consumer with deliver_policy all, by_start_sequence or by_start_time for replays",
            reason="reset_not_allowed",
        )
    if time is not None:
        if policy == "by_start_time" and parse_time(time) < parse_time(config["opt_start_time"]):
            raise ConsumerResetError(
                f"{where} starts at {config['opt_start_time']}: cannot reset to {requested_time}, "
                "which is before its start time",
                reason="below_start_time",
            )
        seq = await first_seq_at_or_after(conn, stream, time)
    if seq is not None and policy == "by_start_sequence" and seq < int(config.get("opt_start_seq") or 0):
        raise ConsumerResetError(
            f"{where} starts at stream sequence {config['opt_start_seq']}: cannot reset below it (to {seq})",
            reason="below_start_seq",
        )
    try:
        reply = await conn.api_request(f"CONSUMER.RESET.{stream}.{name}",
                                       {"seq": seq} if seq is not None else None,
                                       context=f"reset {where}")
    except ConsumerResetError as exc:
        raise ConsumerResetError(
            f"{exc.message} ({where}, deliver_policy {policy!r})",
            reason=_reset_reason(exc.description), code=exc.code, err_code=exc.err_code,
            description=exc.description,
        ) from None
    except LeaderUnavailableError:
        # the server never answers a reset of a missing consumer: one deleted since the lookup
        # would otherwise look like an endless election
        if await find_consumer(conn, stream, name) is None:
            raise ConsumerNotFoundError(f"{where} was deleted during the reset; create it again",
                                        reason="consumer_not_found") from None
        raise
    metrics.incr("consumer.reset", tags={"stream": stream, "consumer": name})
    return {
        "stream": stream,
        "consumer": name,
        "reset_seq": reply.get("reset_seq"),
        "delivered": reply.get("delivered", {}),
        "ack_floor": reply.get("ack_floor", {}),
        "num_pending": reply.get("num_pending", 0),
        "num_ack_pending": reply.get("num_ack_pending", 0),
        "requested_seq": seq,
        "requested_time": requested_time,
    }


def _reset_reason(description: str | None) -> str:
    text = (description or "").lower()
    if "below start seq" in text:
        return "below_start_seq"
    if "below start time" in text:
        return "below_start_time"
    if "not allowed" in text:
        return "reset_not_allowed"
    return "invalid_reset"
