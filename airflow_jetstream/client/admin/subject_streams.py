"""Which stream captures a subject (streams cannot overlap, so at most one)."""

from __future__ import annotations

import logging

import nats.errors
import nats.js.errors

from airflow_jetstream.client.connection import QUORUM_ADVICE, JetStreamConnection
from airflow_jetstream.client.errors import JetStreamNotEnabledError, error_from_api
from airflow_jetstream.client.retry import Deadline, is_leader_unavailable, retry

log = logging.getLogger(__name__)


async def streams_for_subject(conn: JetStreamConnection, subject: str, *,
                              deadline: Deadline | None = None) -> list[str]:
    """The stream that captures ``subject`` as a list (empty when none; streams cannot overlap).

    nats-py's ``find_stream_name_by_subject``, with the toolkit's errors: the server's API errors typed,
    no responder as :class:`JetStreamNotEnabledError`, no reply as a permission error or a leader election
    (retried for ``leader_wait`` on a cluster, or until ``deadline``).
    """
    context = f"streams for {subject!r}"

    async def once() -> list[str]:
        try:
            return [await conn.js.find_stream_name_by_subject(subject)]
        except nats.js.errors.NotFoundError:
            return []
        except nats.js.errors.ServiceUnavailableError as exc:
            if exc.code is None and exc.err_code is None:  # nats-py's stand-in for "no responders"
                raise JetStreamNotEnabledError(f"{context}: no responder: JetStream is not enabled for this "
                                               "account, or the domain / API prefix is wrong") from None
            raise error_from_api(vars(exc), context=context) from None
        except nats.js.errors.APIError as exc:
            raise error_from_api(vars(exc), context=context) from None
        except nats.errors.TimeoutError:
            denied = conn.permission_error(f"{conn.api_prefix}.STREAM.NAMES")
            raise denied or conn.unanswered(f"{context}: no reply within {conn.settings.request_timeout:g}s") from None

    return await retry(context, once, transient=is_leader_unavailable, budget=conn.settings.leader_wait,
                       deadline=deadline, advice=QUORUM_ADVICE, logger=log)
