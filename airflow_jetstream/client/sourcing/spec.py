"""What a durable source is: :class:`DurableSource` (validated locally, nothing sent), its consumer
config and source entry, and how to find its entry in a stream's info."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from airflow_jetstream.client.admin.consumers import DELIVER_POLICIES, REPLAY_POLICIES, filter_config
from airflow_jetstream.client.admin.streams import check_replicas, domain_api_prefix, normalize_placement
from airflow_jetstream.client.errors import ConsumerConfigError, InvalidRequestError
from airflow_jetstream.client.subjects import subjects_overlap, validate_name, validate_subject
from airflow_jetstream.client.times import to_rfc3339

SERVER_MANAGED = "server"
USER_MANAGED = "user"
MODES = (SERVER_MANAGED, USER_MANAGED)
#: What the server requires of a consumer used for durable sourcing.
FLOW_CONTROL_CONSUMER = {
    "ack_policy": "flow_control",
    "flow_control": True,
    "idle_heartbeat": "1s",
    "max_deliver": -1,
}
DEFAULT_MAX_ACK_PENDING = 1000
#: Metadata naming the stream fed by the consumer the server makes on the origin (server-managed source or mirror).
SOURCE_OWNER, MIRROR_OWNER = "_nats.src.stream", "_nats.mirror.stream"

#: How error messages name a user-managed durable source, in the client's and the operator's terms.
USER_MANAGED_HINT = "a user-managed source (mode='user'; user_managed={...} on JetStreamDurableSourceOperator)"


@dataclass(frozen=True)
class DurableSource:
    """What to provision: stream ``stream`` durably sources (or mirrors) ``source``.

    ``domain`` is the origin's JetStream domain when it lives elsewhere (e.g. a leaf node);
    ``api_prefix`` names the origin's JetStream API prefix directly instead (e.g. an imported one).
    ``consumer``, ``deliver_subject``, ``deliver_policy``, ``replay_policy`` and ``max_ack_pending``
    only apply to ``user`` mode; ``filter_subjects``, ``start_seq`` and ``start_time`` to both.
    ``num_replicas`` and ``placement`` (``{"cluster": ..., "tags": [...]}``) are stream ``stream``'s:
    when None, a new stream gets :func:`default_replicas` (3 on a cluster) and an existing one keeps
    what it has; when given, an existing stream is changed to them.
    ``allow_shared_origin``: let a WorkQueue/Interest origin that already feeds another stream feed this
    one too (each message is then copied into both); refused by default (``origin_already_sourced``).
    """

    stream: str
    source: str
    mode: str = SERVER_MANAGED
    consumer: str | None = None
    deliver_subject: str | None = None
    mirror: bool = False
    filter_subjects: tuple[str, ...] = ()
    start_seq: int | None = None
    start_time: str | None = None
    deliver_policy: str | None = None
    replay_policy: str | None = None
    max_ack_pending: int | None = None
    domain: str | None = None
    api_prefix: str | None = None
    num_replicas: int | None = None
    placement: dict[str, Any] | None = None
    allow_shared_origin: bool = False

    @property
    def user_managed(self) -> bool:
        return self.mode == USER_MANAGED

    @property
    def external_api(self) -> str | None:
        return domain_api_prefix(self.domain) if self.domain else self.api_prefix

    @property
    def where(self) -> str:
        """`` in domain 'x'`` / `` via API prefix 'y'`` / empty: for messages."""
        if self.domain:
            return f" in JetStream domain {self.domain!r}"
        return f" via API prefix {self.api_prefix!r}" if self.api_prefix else ""

    def validated(self) -> DurableSource:
        """A normalized copy, or :class:`InvalidRequestError` / :class:`ConsumerConfigError` (nothing sent)."""
        validate_name(self.stream, what="stream name")
        validate_name(self.source, what="origin stream name")
        if self.stream == self.source and not self.external_api:
            raise InvalidRequestError("a stream cannot source itself", reason="invalid_source")
        if self.mode not in MODES:
            raise InvalidRequestError(f"mode must be 'server' or 'user', got {self.mode!r}", reason="invalid_mode")
        if self.domain is not None:
            validate_name(self.domain, what="JetStream domain")
        if self.domain and self.api_prefix:
            raise InvalidRequestError("give either the origin's JetStream domain or its API prefix, not both",
                                      reason="invalid_source")
        if self.api_prefix is not None:
            validate_subject(self.api_prefix, what="origin API prefix")
        filters = (self.filter_subjects,) if isinstance(self.filter_subjects, str) else self.filter_subjects
        filters = tuple(validate_subject(f, allow_wildcards=True, what="filter subject") for f in filters or ())
        if len(set(filters)) != len(filters):
            raise InvalidRequestError("filter_subjects has duplicates", reason="invalid_filter")
        for i, first in enumerate(filters):
            for second in filters[i + 1:]:
                if subjects_overlap(first, second):
                    raise InvalidRequestError(
                        f"filter subjects {first!r} and {second!r} overlap; the server refuses overlapping filters",
                        reason="invalid_filter",
                    )
        start_seq = self.start_seq
        if start_seq is not None and (isinstance(start_seq, bool) or not isinstance(start_seq, int) or start_seq < 1):
            raise InvalidRequestError(f"start_seq must be a stream sequence >= 1, got {start_seq!r}",
                                      reason="invalid_start")
        start_time = to_rfc3339(self.start_time) if self.start_time is not None else None
        if start_seq is not None and start_time is not None:
            raise InvalidRequestError("give start_seq or start_time, not both", reason="invalid_start")
        spec = replace(self, filter_subjects=filters, start_time=start_time,
                       num_replicas=check_replicas(self.num_replicas), placement=normalize_placement(self.placement))
        if not spec.user_managed:
            given = [k for k in ("consumer", "deliver_subject", "deliver_policy", "replay_policy", "max_ack_pending")
                     if getattr(spec, k) is not None]
            if given:
                raise InvalidRequestError(
                    f"{', '.join(given)} only apply to {USER_MANAGED_HINT} (the server picks its own consumer "
                    "in mode='server'); use one to control the consumer",
                    reason="invalid_source",
                )
            return spec
        return spec._validated_user()

    def _validated_user(self) -> DurableSource:
        consumer = self.consumer or f"{self.stream}_SRC_{self.source}"
        deliver = self.deliver_subject or f"_SRC.{self.stream}.{self.source}"
        try:
            validate_name(consumer, what="consumer name")
            validate_subject(deliver, what="deliver subject")
        except InvalidRequestError as exc:
            raise ConsumerConfigError(f"{exc.message} (a durable source needs a concrete deliver subject)",
                                      reason="invalid_source_consumer") from None
        policy = self.deliver_policy
        if policy is not None and policy not in DELIVER_POLICIES:
            raise ConsumerConfigError(
                f"deliver_policy {policy!r} is not valid; use one of {', '.join(DELIVER_POLICIES)}",
                reason="invalid_field")
        if policy == "last_per_subject" and not self.filter_subjects:
            raise ConsumerConfigError("deliver_policy last_per_subject needs filter_subjects (the server refuses it "
                                      "without a filter; use '>' for every subject)", reason="invalid_field")
        if self.start_seq is not None:
            if policy not in (None, "by_start_sequence"):
                raise ConsumerConfigError(f"start_seq needs deliver_policy by_start_sequence, not {policy!r}",
                                          reason="invalid_field")
            policy = "by_start_sequence"
        elif self.start_time is not None:
            if policy not in (None, "by_start_time"):
                raise ConsumerConfigError(f"start_time needs deliver_policy by_start_time, not {policy!r}",
                                          reason="invalid_field")
            policy = "by_start_time"
        elif policy in ("by_start_sequence", "by_start_time"):
            raise ConsumerConfigError(f"deliver_policy {policy!r} needs start_seq or start_time",
                                      reason="invalid_field")
        if self.replay_policy is not None and self.replay_policy not in REPLAY_POLICIES:
            raise ConsumerConfigError(f"replay_policy {self.replay_policy!r} is not valid; use instant or original",
                                      reason="invalid_field")
        pending = DEFAULT_MAX_ACK_PENDING if self.max_ack_pending is None else self.max_ack_pending
        if isinstance(pending, bool) or not isinstance(pending, int) or pending < 1:
            raise ConsumerConfigError(
                f"max_ack_pending must be > 0 for a flow-control consumer, got {pending!r}",
                reason="max_ack_pending_required",
            )
        return replace(self, consumer=consumer, deliver_subject=deliver, deliver_policy=policy or "all",
                       max_ack_pending=pending)

    def consumer_config(self) -> dict[str, Any]:
        """The durable push consumer (``user`` mode) the server accepts for sourcing."""
        cfg: dict[str, Any] = {
            "name": self.consumer,
            "durable_name": self.consumer,
            "deliver_subject": self.deliver_subject,
            "deliver_policy": self.deliver_policy,
            "max_ack_pending": self.max_ack_pending,
            **FLOW_CONTROL_CONSUMER,
        }
        if self.replay_policy:
            cfg["replay_policy"] = self.replay_policy
        if self.start_seq is not None:
            cfg["opt_start_seq"] = self.start_seq
        if self.start_time is not None:
            cfg["opt_start_time"] = self.start_time
        return {**cfg, **filter_config(self.filter_subjects)}

    def source_entry(self) -> dict[str, Any]:
        """The ``sources[]`` / ``mirror`` entry of stream ``A``."""
        entry: dict[str, Any] = {"name": self.source}
        if self.external_api:
            entry["external"] = {"api": self.external_api}
        if self.user_managed:
            entry["consumer"] = {"name": self.consumer, "deliver_subject": self.deliver_subject}
            return entry
        if self.start_seq is not None:
            entry["opt_start_seq"] = self.start_seq
        if self.start_time is not None:
            entry["opt_start_time"] = self.start_time
        if len(self.filter_subjects) == 1:
            entry["filter_subject"] = self.filter_subjects[0]
        elif self.filter_subjects:
            entry["subject_transforms"] = [{"src": f, "dest": ""} for f in self.filter_subjects]
        return entry

    def is_same_origin(self, entry: dict[str, Any]) -> bool:
        """True when ``entry`` (of A's sources) reads from this origin in this domain."""
        api = (entry.get("external") or {}).get("api")
        return entry.get("name") == self.source and api == self.external_api


def entry_filters(entry: dict[str, Any]) -> tuple[str, ...]:
    if entry.get("filter_subject"):
        return (entry["filter_subject"],)
    return tuple(t["src"] for t in entry.get("subject_transforms") or [] if t.get("src"))


def find_entry(info: dict[str, Any], spec: DurableSource) -> dict[str, Any] | None:
    """The source state (``lag``, ``active``, ``error``, ...) of this origin in A's stream info."""
    if spec.mirror:
        mirror = info.get("mirror")
        return mirror if mirror and spec.is_same_origin(mirror) else None
    matches = [e for e in info.get("sources") or [] if spec.is_same_origin(e)]
    return matches[0] if matches else None
