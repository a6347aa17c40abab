"""JetStreamDurableSourceOperator: make a stream source (or mirror) another one durably."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.sourcing.provision import DurableSource, provision_durable_source
from airflow_jetstream.operators.base import JetStreamBaseOperator
from airflow_jetstream.triggers.describe import human_duration


class JetStreamDurableSourceOperator(JetStreamBaseOperator):
    """Make ``stream`` source (or, with ``mirror=True``, mirror) ``source`` without losing messages.

    - ``mode="server"``: a plain source on a WorkQueue or Interest origin; the server creates and
      manages a durable flow-control consumer (``JS_SRC_*`` / ``JS_MIRROR_*``) on the origin. A Limits
      origin is refused (the server would use an ephemeral consumer there): use ``mode="user"``.
    - ``mode="user"``: the operator creates or updates the durable push consumer ``consumer`` on the
      origin (ack policy flow_control, flow control, 1 s heartbeat, max_deliver -1) with the filter,
      start and deliver/replay policy, and points the source at it through ``deliver_subject``.
      An existing plain source of the same origin is migrated without loss or duplicates.

    ``stream`` is created when missing; its other sources are kept; re-runs are no-ops. Success is
    only returned once the server reports the source active without error (``health_timeout``).
    ``domain`` is the origin's JetStream domain when it lives on a leaf node or another domain.
    Returns ``{"mode", "action", "consumer", "deliver_subject", "source_state", ...}``::

        JetStreamDurableSourceOperator(
            task_id="aggregate_from_edge",
            stream="AGG",
            source="ORDERS_EDGE",
            mode="user",
            domain="edge",
            filter_subjects=["orders.eu.>"],
            start_time="{{ data_interval_start }}",
        )

    :param stream: the aggregate stream (templated).
    :param source: the origin stream (templated).
    :param mode: ``"server"`` or ``"user"``.
    :param consumer: user mode: durable consumer name (default ``<stream>_SRC_<source>``).
    :param deliver_subject: user mode: deliver subject (default ``_SRC.<stream>.<source>``).
    :param mirror: mirror instead of source.
    :param filter_subjects: only these origin subjects (templated).
    :param start_seq: start at this origin sequence (templated).
    :param start_time: start at this time, ISO 8601 (templated).
    :param deliver_policy: user mode: ``all``, ``last``, ``new``, ``last_per_subject`` (needs a filter), ...
    :param replay_policy: user mode: ``instant`` or ``original``.
    :param max_ack_pending: user mode: messages in flight before sourcing waits (default 1000).
    :param domain: the origin's JetStream domain, if not the connection's.
    :param api_prefix: or the origin's JetStream API prefix (e.g. ``$JS.edge.API`` or an imported prefix).
    :param num_replicas: replicas of ``stream``, 1-5 (templated). Unset: a new stream gets 3 on a cluster
        (1 on a single server) and an existing one keeps its own; set: an existing stream is changed to it.
    :param allow_shared_origin: let a WorkQueue/Interest origin that already feeds another stream feed this one
        too (every message is then copied into both); refused by default with ``origin_already_sourced``.
    :param placement: where ``stream``'s replicas go, ``{"cluster": ..., "tags": [...]}`` (templated; unset: kept).
    :param create_consumer: user mode: False to use a consumer someone else created (it is checked).
    :param health_timeout: seconds to wait for the source to become healthy.
    :param nats_conn_id: the ``nats`` connection to use.
    """

    template_fields: Sequence[str] = ("stream", "source", "consumer", "deliver_subject", "filter_subjects",
                                      "start_seq", "start_time", "domain", "api_prefix", "num_replicas", "placement")
    ui_color = "#27aae1"

    def __init__(
        self,
        *,
        stream: str,
        source: str,
        mode: str = "server",
        consumer: str | None = None,
        deliver_subject: str | None = None,
        mirror: bool = False,
        filter_subjects: list[str] | str | None = None,
        start_seq: int | str | None = None,
        start_time: str | None = None,
        deliver_policy: str | None = None,
        replay_policy: str | None = None,
        max_ack_pending: int | None = None,
        domain: str | None = None,
        api_prefix: str | None = None,
        create_consumer: bool = True,
        health_timeout: float | str | timedelta = 30.0,
        num_replicas: int | str | None = None,
        placement: dict[str, Any] | None = None,
        allow_shared_origin: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.source = source
        self.mode = mode
        self.consumer = consumer
        self.deliver_subject = deliver_subject
        self.mirror = mirror
        self.filter_subjects = filter_subjects
        self.start_seq = start_seq
        self.start_time = start_time
        self.deliver_policy = deliver_policy
        self.replay_policy = replay_policy
        self.max_ack_pending = max_ack_pending
        self.domain = domain
        self.api_prefix = api_prefix
        self.create_consumer = create_consumer
        self.health_timeout = to_seconds(health_timeout, field="health_timeout")
        self.num_replicas = num_replicas
        self.placement = placement
        self.allow_shared_origin = allow_shared_origin

    def spec(self) -> DurableSource:
        """The validated provisioning request (raises before any call on bad input)."""
        filters = self.filter_subjects
        if isinstance(filters, str):
            filters = [f.strip() for f in filters.split(",") if f.strip()]
        start_seq = self.start_seq
        if isinstance(start_seq, str) and start_seq.strip().isdigit():
            start_seq = int(start_seq)
        return DurableSource(
            stream=self.stream, source=self.source, mode=self.mode, consumer=self.consumer or None,
            deliver_subject=self.deliver_subject or None, mirror=self.mirror,
            filter_subjects=tuple(filters or ()), start_seq=start_seq, start_time=self.start_time or None,
            deliver_policy=self.deliver_policy, replay_policy=self.replay_policy,
            max_ack_pending=self.max_ack_pending, domain=self.domain or None, api_prefix=self.api_prefix or None,
            num_replicas=self.num_replicas, placement=self.placement, allow_shared_origin=self.allow_shared_origin,
        ).validated()

    def execute(self, context: Any) -> dict[str, Any]:
        spec = self.spec()
        kind = "mirror" if spec.mirror else "source"
        where = spec.where
        self.log.info("Provisioning %s-managed durable %s %s%s -> %s", spec.mode, kind, spec.source, where, spec.stream)
        result = self.hook.run(provision_durable_source, spec, health_timeout=self.health_timeout,
                               create_consumer=self.create_consumer)
        if result["action"] == "migrated":
            self.log.info("Migrated the plain source of %s to consumer %s, starting after origin seq %s",
                          spec.source, result["consumer"], result["migrated_after_seq"])
        else:
            self.log.info("Durable %s %s -> %s %s (consumer %s, %d replica(s))", kind, spec.source, spec.stream,
                          result["action"], result["consumer"], result["num_replicas"])
        active = result["source_state"].get("active")
        self.log.info("Source healthy: lag %s message(s), last active %s ago; consumer pending %s",
                      result["source_state"].get("lag"), human_duration(active / 1e9) if active else "0 ms",
                      result["consumer_state"].get("num_pending"))
        return result
