"""JetStreamDurableSourceOperator: make a stream source (or mirror) another one durably."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.sourcing.spec import SERVER_MANAGED, USER_MANAGED, DurableSource
from airflow_jetstream.operators.base import JetStreamBaseOperator, subject_list, templated_int
from airflow_jetstream.triggers.consumer import human_duration
from airflow_jetstream.ui.links import JetStreamViewLink

USER_MANAGED_OPTIONS = ("consumer", "deliver_subject", "deliver_policy", "replay_policy", "max_ack_pending",
                        "create_consumer")


class JetStreamDurableSourceOperator(JetStreamBaseOperator):
    """Make ``stream`` source (or, with ``mirror=True``, mirror) ``source`` without losing messages.

    Server-managed (default): a plain source on a WorkQueue or Interest origin, whose durable consumer the
    server manages; a Limits origin is refused (the server would use an ephemeral consumer there).
    ``user_managed={...}`` (``True``: the defaults): the operator creates or updates the durable push consumer
    on the origin and points the source at it; an existing plain source of the origin is migrated without loss
    or duplicates. ``stream`` is created when missing, its other sources are kept, and success is returned only
    once the server reports the source active without error (``health_timeout``). Parameters, the
    ``user_managed`` options and the result: docs/operators/sourcing.md.
    """

    template_fields: Sequence[str] = ("stream", "source", "user_managed", "filter_subjects", "start_seq",
                                      "start_time", "domain", "api_prefix", "num_replicas", "placement")
    template_fields_renderers = {"user_managed": "json"}
    operator_extra_links = (JetStreamViewLink(),)

    def __init__(self, *, stream: str, source: str, user_managed: dict[str, Any] | bool | None = None,
                 mirror: bool = False, filter_subjects: list[str] | str | None = None,
                 start_seq: int | str | None = None, start_time: str | None = None, domain: str | None = None,
                 api_prefix: str | None = None, health_timeout: float | str | timedelta = 30.0,
                 num_replicas: int | str | None = None, placement: dict[str, Any] | None = None,
                 allow_shared_origin: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mode = USER_MANAGED if user_managed not in (None, False) else SERVER_MANAGED
        self.user_managed = _user_managed_options(None if user_managed is None or user_managed is False
                                                  else {} if user_managed is True else user_managed)
        self.stream = stream
        self.source = source
        self.mirror = mirror
        self.filter_subjects = filter_subjects
        self.start_seq = start_seq
        self.start_time = start_time
        self.domain = domain
        self.api_prefix = api_prefix
        self.health_timeout = to_seconds(health_timeout, field="health_timeout")
        self.num_replicas = num_replicas
        self.placement = placement
        self.allow_shared_origin = allow_shared_origin

    def spec(self) -> DurableSource:
        """The validated provisioning request (raises before any call on bad input)."""
        user = self.user_managed or {}
        return DurableSource(
            stream=self.stream, source=self.source, mode=self.mode, consumer=user.get("consumer") or None,
            deliver_subject=user.get("deliver_subject") or None, mirror=self.mirror,
            filter_subjects=tuple(subject_list(self.filter_subjects)),
            start_seq=templated_int(self.start_seq, "start_seq"), start_time=self.start_time or None,
            deliver_policy=user.get("deliver_policy"), replay_policy=user.get("replay_policy"),
            max_ack_pending=user.get("max_ack_pending"), domain=self.domain or None,
            api_prefix=self.api_prefix or None, num_replicas=self.num_replicas, placement=self.placement,
            allow_shared_origin=self.allow_shared_origin,
        ).validated()

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_jetstream.client.sourcing.provision import provision_durable_source

        spec = self.spec()
        kind = "mirror" if spec.mirror else "source"
        where = spec.where
        self.log.info("Provisioning %s-managed durable %s %s%s -> %s", spec.mode, kind, spec.source, where, spec.stream)
        create_consumer = (self.user_managed or {}).get("create_consumer", True)
        result = self.hook.run(provision_durable_source, spec, health_timeout=self.health_timeout,
                               create_consumer=bool(create_consumer))
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


def _user_managed_options(options: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``user_managed`` dict, refused at DAG parse time when it names an unknown option."""
    if options is None:
        return None
    if not isinstance(options, dict):
        raise InvalidRequestError(f"user_managed must be a dict of {', '.join(USER_MANAGED_OPTIONS)}, True or None; "
                                  f"got {options!r}", reason="invalid_source")
    unknown = sorted(set(options) - set(USER_MANAGED_OPTIONS))
    if unknown:
        raise InvalidRequestError(f"user_managed has unknown option(s) {', '.join(unknown)}; known: "
                                  f"{', '.join(USER_MANAGED_OPTIONS)}", reason="invalid_source")
    return dict(options)

