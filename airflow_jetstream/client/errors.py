"""Typed errors of the JetStream toolkit.

Every error carries a machine-readable ``reason`` (for example ``batch_too_large``), the server's
``code``/``err_code`` when the server produced it, and a message a user can act on. Messages never
contain secrets: they are built from subjects, stream names and server descriptions only.
"""

from __future__ import annotations

from typing import Any


class JetStreamError(Exception):
    """Base class of every error raised by :mod:`airflow_jetstream.client`."""

    default_reason = "jetstream_error"

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
        }

    def __str__(self) -> str:
        codes = ""
        if self.err_code is not None:
            codes = f" [{self.code}/{self.err_code}]"
        return f"{self.message}{codes} (reason: {self.reason})"


class InvalidSettingsError(JetStreamError):
    """Connection settings are malformed (bad server URL, unknown TLS file, bad extras)."""

    default_reason = "invalid_settings"


class ConnectionFailedError(JetStreamError):
    """No server could be reached within the connect timeout."""

    default_reason = "server_unreachable"


class AuthenticationError(ConnectionFailedError):
    """The server refused the credentials (user/password, token, nkey or creds)."""

    default_reason = "authentication_failed"


class TLSConfigurationError(ConnectionFailedError):
    """The TLS handshake failed: untrusted CA, hostname mismatch, or TLS required/unsupported."""

    default_reason = "tls_failed"


class PermissionDeniedError(JetStreamError):
    """The server's permissions deny publishing or subscribing to a subject."""

    default_reason = "permission_denied"

    def __init__(self, message: str, *, subject: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.subject = subject


class JetStreamNotEnabledError(JetStreamError):
    """The server or account has no JetStream, or the API prefix/domain is wrong."""

    default_reason = "jetstream_not_enabled"


class RequestTimeoutError(JetStreamError):
    """A JetStream API request got no answer in time."""

    default_reason = "timeout"


class LeaderUnavailableError(RequestTimeoutError):
    """A stream, consumer or the JetStream meta layer has no leader (an election in a cluster).

    Transient: API calls retry it for the connection's ``leader_wait`` seconds before raising.
    """

    default_reason = "leader_unavailable"


class InvalidRequestError(JetStreamError):
    """Input rejected locally, before anything was sent to the server."""

    default_reason = "invalid_request"


class InvalidSubjectError(InvalidRequestError):
    """A subject is empty, has white space or empty tokens, or a wildcard where none is allowed."""

    default_reason = "invalid_subject"


class StreamConfigError(JetStreamError):
    """A stream configuration is invalid or changes a field the server cannot change."""

    default_reason = "invalid_stream_config"


class StreamNotFoundError(JetStreamError):
    """The stream does not exist."""

    default_reason = "stream_not_found"


class ConsumerNotFoundError(JetStreamError):
    """The consumer does not exist on the stream."""

    default_reason = "consumer_not_found"


class ConsumerConfigError(JetStreamError):
    """A consumer configuration is invalid for the requested use."""

    default_reason = "invalid_consumer_config"


class ServerAPIError(JetStreamError):
    """Any other error answered by the JetStream API."""

    default_reason = "api_error"


class LimitReachedError(ServerAPIError):
    """A server or account limit refused the request (``reason`` names it: ``consumer_limit``, ``stream_limit``)."""

    default_reason = "limit_reached"


class PlacementError(JetStreamError):
    """The cluster cannot place the stream or bucket: too many replicas, unknown cluster or tags, no room."""

    default_reason = "placement_failed"


class BatchPublishError(JetStreamError):
    """An atomic or fast batch was refused; nothing of it was stored unless ``reason`` says so."""

    default_reason = "batch_failed"


class FastBatchError(BatchPublishError):
    """A fast batch failed part way; ``stored`` of its messages (its first ``stored``) are in the stream.

    ``stored`` is established from the server (its final ack, or by reading the stream back), or None
    when that was impossible (then the message says where to look). ``total`` is the batch's size.
    """

    def __init__(self, message: str, *, stored: int | None, total: int, stream: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.stored = stored
        self.total = total
        self.stream = stream

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "stored": self.stored, "total": self.total, "stream": self.stream}


class ConsumerResetError(JetStreamError):
    """The server refused a consumer reset (deliver policy or start position forbid it)."""

    default_reason = "invalid_reset"


class TooManySubjectsError(InvalidRequestError):
    """A per-worker consumer was given more filter subjects than its cap allows."""

    default_reason = "too_many_subjects"


class LedgerError(JetStreamError):
    """Base class of the batch ledger's errors (client/ledger/batch_ledger.py)."""

    default_reason = "ledger_error"


class LedgerNotFoundError(LedgerError):
    """The ledger's KV bucket does not exist."""

    default_reason = "ledger_not_found"


class BatchNotFoundError(LedgerError):
    """No ledger entry exists for this run and batch."""

    default_reason = "batch_not_found"


class LedgerConflictError(LedgerError):
    """A ledger entry already holds different data, or kept changing under a compare-and-set."""

    default_reason = "ledger_conflict"


class LedgerRecordError(LedgerConflictError):
    """A ledger value does not match the record schema (docs/schemas/ledger-record.schema.json)."""

    default_reason = "ledger_record_invalid"


class ClaimLostError(LedgerError):
    """The claim on a batch is no longer held (its visibility timeout expired and it was reaped)."""

    default_reason = "claim_lost"


class BatchesFailedError(LedgerError):
    """Batches of a run went to ``failed`` (past max attempts): they need attention, not waiting."""

    default_reason = "batches_failed"

    def __init__(self, message: str, *, failed: list[dict[str, Any]] | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.failed = failed or []

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "failed": self.failed}


class LedgerWaitTimeoutError(LedgerError):
    """The batches of a run did not all reach the awaited state in time."""

    default_reason = "wait_timeout"


class InvalidFunctionError(InvalidRequestError):
    """An ``apply_function`` is not a callable, or its dotted path does not import."""

    default_reason = "invalid_function"


class ApplyFunctionError(JetStreamError):
    """A user's ``apply_function`` raised: the messages it was given were not acknowledged."""

    default_reason = "apply_function_failed"


class ServerFeatureError(JetStreamError):
    """The connected nats-server is too old for a feature or stream config field (client/server_features.py)."""

    default_reason = "server_too_old"


class AirflowFeatureError(JetStreamError):
    """The installed Airflow is too old for a feature (airflow_jetstream/airflow_compat.py)."""

    default_reason = "airflow_too_old"


class SparkInstallError(JetStreamError):
    """The installed pyspark packages do not fit together (airflow_jetstream/spark/versions.py)."""

    default_reason = "spark_version_mismatch"


class NatsPyVersionError(JetStreamError):
    """The installed nats-py changed an internal this toolkit uses (airflow_jetstream/client/natspy_internals.py)."""

    default_reason = "natspy_incompatible"


class KeyValueError(JetStreamError):
    """Base class of the key-value errors (client/kv/)."""

    default_reason = "kv_error"


class BucketNotFoundError(KeyValueError):
    """The KV bucket does not exist."""

    default_reason = "bucket_not_found"


class KeyNotFoundError(KeyValueError):
    """The key does not exist in the bucket (never written, deleted or purged)."""

    default_reason = "key_not_found"


class KeyRevisionError(KeyValueError):
    """A compare-and-set failed: the key exists (create) or is at another revision (update, delete)."""

    default_reason = "wrong_revision"


class InvalidKeyError(InvalidRequestError):
    """A KV key or bucket name is malformed."""

    default_reason = "invalid_key"


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
