"""Typed errors of the JetStream toolkit.

Every error carries a machine-readable ``reason`` (for example ``batch_too_large``), the server's
``code``/``err_code`` when the server produced it, and a message a user can act on. Messages never
contain secrets: they are built from subjects, stream names and server descriptions only.
"""

from __future__ import annotations

from typing import Any

_BY_REASON: dict[str, type[JetStreamError]] = {}


class JetStreamError(Exception):
    """Base class of every error raised by :mod:`airflow_jetstream.client`.

    A subclass names its ``reason`` in its class line (``class StreamNotFoundError(JetStreamError,
    reason="stream_not_found")``) and the attributes of its own that :meth:`to_dict` carries in ``facts``.
    """

    default_reason = "jetstream_error"
    facts: tuple[str, ...] = ()

    def __init_subclass__(cls, reason: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if reason:
            cls.default_reason = reason
            _BY_REASON.setdefault(reason, cls)

    @classmethod
    def of_reason(cls, reason: str) -> type[JetStreamError]:
        """The error class that names ``reason`` (a per-item result's ``error``), else :class:`JetStreamError`."""
        return _BY_REASON.get(reason, JetStreamError)

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        code: int | None = None,
        err_code: int | None = None,
        description: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.code = code
        self.err_code = err_code
        self.description = description

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, for XCom, logs and per-item results."""
        return {
            "error": type(self).__name__,
            "reason": self.reason,
            "message": self.message,
            "code": self.code,
            "err_code": self.err_code,
            **{name: getattr(self, name) for name in self.facts},
        }

    def __str__(self) -> str:
        codes = ""
        if self.err_code is not None:
            codes = f" [{self.code}/{self.err_code}]"
        return f"{self.message}{codes} (reason: {self.reason})"


class InvalidSettingsError(JetStreamError, reason="invalid_settings"):
    """Connection settings are malformed (bad server URL, unknown TLS file, bad extras)."""


class ConnectionFailedError(JetStreamError, reason="server_unreachable"):
    """No server could be reached within the connect timeout."""


class AuthenticationError(ConnectionFailedError, reason="authentication_failed"):
    """The server refused the credentials (user/password, token, nkey or creds)."""


class TLSConfigurationError(ConnectionFailedError, reason="tls_failed"):
    """The TLS handshake failed: untrusted CA, hostname mismatch, or TLS required/unsupported."""


class PermissionDeniedError(JetStreamError, reason="permission_denied"):
    """The server's permissions deny publishing or subscribing to a subject."""

    def __init__(self, message: str, *, subject: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.subject = subject


class JetStreamNotEnabledError(JetStreamError, reason="jetstream_not_enabled"):
    """The server or account has no JetStream, or the API prefix/domain is wrong."""


class RequestTimeoutError(JetStreamError, reason="timeout"):
    """A JetStream API request got no answer in time."""


class LeaderUnavailableError(RequestTimeoutError, reason="leader_unavailable"):
    """A stream, consumer or the JetStream meta layer has no leader (an election in a cluster).

    Transient: API calls retry it for the connection's ``leader_wait`` seconds before raising.
    """


class InvalidRequestError(JetStreamError, reason="invalid_request"):
    """Input rejected locally, before anything was sent to the server."""


class InvalidSubjectError(InvalidRequestError, reason="invalid_subject"):
    """A subject is empty, has white space or empty tokens, or a wildcard where none is allowed."""


class StreamConfigError(JetStreamError, reason="invalid_stream_config"):
    """A stream configuration is invalid or changes a field the server cannot change."""


class StreamNotFoundError(JetStreamError, reason="stream_not_found"):
    """The stream does not exist."""


class ConsumerNotFoundError(JetStreamError, reason="consumer_not_found"):
    """The consumer does not exist on the stream."""


class ConsumerConfigError(JetStreamError, reason="invalid_consumer_config"):
    """A consumer configuration is invalid for the requested use."""


class ServerAPIError(JetStreamError, reason="api_error"):
    """Any other error answered by the JetStream API."""


class LimitReachedError(ServerAPIError, reason="limit_reached"):
    """A server or account limit refused the request (``reason`` names it: ``consumer_limit``, ``stream_limit``)."""


class PlacementError(JetStreamError, reason="placement_failed"):
    """The cluster cannot place the stream or bucket: too many replicas, unknown cluster or tags, no room."""


class BatchPublishError(JetStreamError, reason="batch_failed"):
    """An atomic or fast batch was refused; nothing of it was stored unless ``reason`` says so."""


class FastBatchError(BatchPublishError):
    """A fast batch failed part way; ``stored`` of its messages (its first ``stored``) are in the stream.

    ``stored`` is established from the server (its final ack, or by reading the stream back), or None
    when that was impossible (then the message says where to look). ``total`` is the batch's size.
    """

    facts = ("stored", "total", "stream")

    def __init__(self, message: str, *, stored: int | None, total: int, stream: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.stored = stored
        self.total = total
        self.stream = stream


class ConsumerResetError(JetStreamError, reason="invalid_reset"):
    """The server refused a consumer reset (deliver policy or start position forbid it)."""


class TooManySubjectsError(InvalidRequestError, reason="too_many_subjects"):
    """A per-worker consumer was given more filter subjects than its cap allows."""


class LedgerError(JetStreamError, reason="ledger_error"):
    """Base class of the batch ledger's errors (client/ledger/batch_ledger.py)."""


class LedgerNotFoundError(LedgerError, reason="ledger_not_found"):
    """The ledger's KV bucket does not exist."""


class BatchNotFoundError(LedgerError, reason="batch_not_found"):
    """No ledger entry exists for this run and batch."""


class LedgerConflictError(LedgerError, reason="ledger_conflict"):
    """A ledger entry already holds different data, or kept changing under a compare-and-set."""


class LedgerRecordError(LedgerConflictError, reason="ledger_record_invalid"):
    """A ledger value does not match the record schema (docs/schemas/ledger-record.schema.json)."""


class ClaimLostError(LedgerError, reason="claim_lost"):
    """The claim on a batch is no longer held (its visibility timeout expired and it was reaped)."""


class BatchesFailedError(LedgerError, reason="batches_failed"):
    """Batches of a run went to ``failed`` (past max attempts): they need attention, not waiting."""

    facts = ("failed",)

    def __init__(self, message: str, *, failed: list[dict[str, Any]] | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.failed = failed or []


class LedgerWaitTimeoutError(LedgerError, reason="wait_timeout"):
    """The batches of a run did not all reach the awaited state in time."""


class InvalidFunctionError(InvalidRequestError, reason="invalid_function"):
    """An ``apply_function`` is not a callable, or its dotted path does not import."""


class ApplyFunctionError(JetStreamError, reason="apply_function_failed"):
    """A user's ``apply_function`` raised: the messages it was given were not acknowledged."""


class ServerFeatureError(JetStreamError, reason="server_too_old"):
    """The connected nats-server is too old for a feature or stream config field (client/server_features.py)."""


class AirflowFeatureError(JetStreamError, reason="airflow_too_old"):
    """The installed Airflow is too old for a feature (airflow_jetstream/airflow_compat.py)."""


class SparkInstallError(JetStreamError, reason="spark_version_mismatch"):
    """The installed pyspark packages do not fit together (airflow_jetstream/spark/package.py)."""


class NatsPyVersionError(JetStreamError, reason="natspy_incompatible"):
    """The installed nats-py changed an internal this toolkit uses (airflow_jetstream/client/natspy_internals.py)."""


class KeyValueError(JetStreamError, reason="kv_error"):
    """Base class of the key-value errors (client/kv/)."""


class BucketNotFoundError(KeyValueError, reason="bucket_not_found"):
    """The KV bucket does not exist."""


class KeyNotFoundError(KeyValueError, reason="key_not_found"):
    """The key does not exist in the bucket (never written, deleted or purged)."""


class KeyRevisionError(KeyValueError, reason="wrong_revision"):
    """A compare-and-set failed: the key exists (create) or is at another revision (update, delete)."""


class InvalidKeyError(InvalidRequestError, reason="invalid_key"):
    """A KV key or bucket name is malformed."""


_ELECTION = (LeaderUnavailableError, "leader_unavailable",
             "the cluster is electing a leader; retry shortly, or check that a quorum of servers runs")
_WRONG_LAST_SEQUENCE = (BatchPublishError, "wrong_last_sequence", "re-read the stream's last sequence and retry")
# err_code -> (error class, reason, what the user can do). Codes from nats-server 2.15.
_API_ERRORS: dict[int, tuple[type[JetStreamError], str, str]] = {
    10059: (StreamNotFoundError, "stream_not_found", "create it first (JetStreamEnsureStreamOperator)"),
    10014: (ConsumerNotFoundError, "consumer_not_found", "check the consumer name or create it"),
    10058: (StreamConfigError, "stream_name_in_use", "a stream with this name exists with another config"),
    10065: (StreamConfigError, "subjects_overlap", "another stream already captures these subjects"),
    10052: (StreamConfigError, "invalid_stream_config", "fix the stream configuration"),
    10025: (InvalidRequestError, "bad_request", "the request JSON has a field the server does not know"),
    10039: (JetStreamNotEnabledError, "jetstream_not_enabled", "enable JetStream for the account"),
    10076: (JetStreamNotEnabledError, "jetstream_not_enabled", "enable JetStream on the server"),
    10174: (BatchPublishError, "stream_not_atomic", "set allow_atomic: true on the stream"),
    10175: (BatchPublishError, "batch_sequence_missing", "send Nats-Batch-Sequence on every message"),
    10176: (BatchPublishError, "batch_incomplete", "re-send the whole batch"),
    10199: (BatchPublishError, "batch_too_large", "split the batch below the server's max_msgs"),
    10179: (BatchPublishError, "batch_id_invalid", "use a batch id of at most 64 characters"),
    10200: (BatchPublishError, "batch_commit_invalid", "commit with '1' or 'eob'"),
    10210: (BatchPublishError, "too_many_inflight", "retry later or raise max_inflight_per_stream"),
    10071: _WRONG_LAST_SEQUENCE,
    10164: _WRONG_LAST_SEQUENCE,
    10201: (BatchPublishError, "duplicate_msg_id", "the batch (or part of it) is already stored"),
    10158: (BatchPublishError, "msg_id_in_process",
            "a message with this msg id is being stored right now; asking again shortly is safe"),
    10177: (BatchPublishError, "unsupported_header", "remove headers atomic batches refuse"),
    10185: (BatchPublishError, "api_level_too_high", "upgrade the server"),
    10054: (ServerAPIError, "message_too_large", "the message is over the stream's max_msg_size"),
    10205: (BatchPublishError, "stream_not_batched", "set allow_batched: true on the stream"),
    10206: (BatchPublishError, "batch_pattern_invalid", "internal: fast batch reply subject is malformed"),
    10207: (BatchPublishError, "batch_id_invalid", "use a shorter batch id"),
    10208: (BatchPublishError, "batch_unknown", "the fast batch timed out on the server; re-send"),
    10211: (BatchPublishError, "too_many_inflight", "retry later"),
    10204: (ConsumerResetError, "invalid_reset", "the consumer's deliver policy or start forbids it"),
    10213: (StreamConfigError, "invalid_mirror_consumer", "fix the mirror's consumer settings"),
    10215: (StreamConfigError, "invalid_source_consumer", "fix the source's consumer settings"),
    10216: (StreamConfigError, "duplicate_source_consumer", "use one consumer per source"),
    10217: (ConsumerConfigError, "consumer_not_flow_control", "use a flow-control push consumer"),
    10218: (ConsumerConfigError, "flow_control_needs_push", "give the consumer a deliver subject"),
    10219: (ConsumerConfigError, "flow_control_off", "set flow_control: true"),
    10220: (ConsumerConfigError, "max_ack_pending_required", "set max_ack_pending > 0"),
    10221: (ConsumerConfigError, "ack_wait_not_allowed", "remove ack_wait/backoff"),
    10222: (ConsumerConfigError, "max_deliver_must_be_unlimited", "set max_deliver: -1"),
    10100: (ConsumerConfigError, "workqueue_filter_not_unique",
            "on a WorkQueue stream a subject may be filtered by one consumer only: remove it from the other first"),
    10138: (ConsumerConfigError, "filter_subjects_overlap", "keep only the wider of the overlapping filters"),
    10026: (LimitReachedError, "consumer_limit",
            "the stream's max_consumers is reached (nats-server allows 1,000 consumers on a stream that leaves it "
            "unset) or the account's consumer limit is: raise max_consumers on the stream (an explicit value lifts "
            "the default) or delete consumers nobody reads"),
    10027: (LimitReachedError, "stream_limit",
            "the account's maximum number of streams is reached: delete unused streams or raise the account limit"),
    10008: _ELECTION,
    10009: _ELECTION,
    10005: (PlacementError, "placement_failed",
            "lower num_replicas to at most the number of JetStream servers, or fix the placement cluster/tags"),
    10074: (PlacementError, "replicas_need_cluster", "a single server holds only num_replicas=1; set it to 1"),
    10023: (PlacementError, "insufficient_resources", "lower num_replicas/max_bytes or add JetStream servers"),
    10047: (PlacementError, "insufficient_resources", "lower max_bytes or num_replicas, or add JetStream storage"),
}


def error_from_api(error: dict[str, Any], *, context: str = "") -> JetStreamError:
    """Turn a JetStream API ``{"code", "err_code", "description"}`` into a typed error."""
    code = error.get("code")
    err_code = error.get("err_code")
    description = str(error.get("description") or "unknown error")
    cls, reason, hint = _API_ERRORS.get(err_code or -1, (ServerAPIError, "api_error", ""))
    if err_code == 10005:
        reason, hint = _placement_cause(description)
    if cls is ServerAPIError and code == 404:
        cls, reason = ServerAPIError, "not_found"
    where = f"{context}: " if context else ""
    message = f"{where}{description}" + (f"; {hint}" if hint else "")
    return cls(message, reason=reason, code=code, err_code=err_code, description=description)


def _placement_cause(description: str) -> tuple[str, str]:
    """Reason and advice for 10005 from the causes the server lists after "no suitable peers for placement"."""
    causes = {c.strip() for c in description.split(",")[1:] if c.strip()}
    # "peer offline": no news from a known server yet; "miscellaneous issue": a known server not heard of since
    # the meta leader started (or one at its max_ha_assets). Both are what a cluster looks like while it starts.
    if causes and causes <= {"peer offline", "miscellaneous issue"}:
        return ("peers_offline", "servers of the cluster are offline or have not joined it yet: start them; lower "
                "num_replicas only if the cluster has fewer JetStream servers than that")
    if not causes:
        return ("placement_failed", "lower num_replicas to at most the number of JetStream servers in the cluster, "
                "or fix placement.cluster if it names no cluster")
    return "placement_failed", "fix the placement (cluster, tags) or the servers' storage; see the causes listed"
