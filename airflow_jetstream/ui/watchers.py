"""The event watchers of a connection, from Airflow's metadata database: the message triggers its asset watchers run.

A watcher whose stream does not exist yet waits without end (triggers/message.py says so once in the triggerer's
log); the view lists it as a problem, since no event comes until the stream does. Read in the api-server, beside
the connection's settings: the trigger rows of one class, their arguments decrypted as the triggerer does.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

#: The trigger event-driven DAGs' asset watchers run (``JetStreamMessageQueueProvider``).
MESSAGE_TRIGGER = "airflow_jetstream.triggers.message.JetStreamMessageTrigger"
DEFAULT_CONN_ID = "nats_default"


def event_watchers(connection_id: str) -> dict[str, Any]:
    """``{"watchers": [{trigger_id, stream, consumer, names, created}]}`` of ``connection_id``; ``{"error": ...}``
    when the metadata database cannot be read (the section is then unreadable, the rest of the view still shows)."""
    from airflow.models.asset import AssetWatcherModel
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from cryptography.fernet import InvalidToken
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.orm import lazyload

    try:
        with create_session() as session:
            watchers = []
            # the rows alone: not the task instances and runs Airflow's model loads with a trigger
            for trigger in session.scalars(select(Trigger).where(Trigger.classpath == MESSAGE_TRIGGER)
                                           .options(lazyload("*"))):
                kwargs = trigger.kwargs
                if (kwargs.get("nats_conn_id") or DEFAULT_CONN_ID) != connection_id:
                    continue
                names = session.scalars(select(AssetWatcherModel.name)
                                        .where(AssetWatcherModel.trigger_id == trigger.id)).all()
                watchers.append({"trigger_id": trigger.id, "stream": kwargs.get("stream"),
                                 "consumer": kwargs.get("consumer"), "names": sorted(names),
                                 "created": trigger.created_date.isoformat() if trigger.created_date else None})
    except (SQLAlchemyError, InvalidToken) as exc:  # a database that cannot be read; kwargs under another key
        log.warning("JetStream view: Airflow's trigger table could not be read", exc_info=True)
        return {"error": {"error": type(exc).__name__, "reason": "metadata_unreadable", "code": None,
                          "err_code": None, "message": f"Airflow's trigger table could not be read "
                                                       f"({type(exc).__name__}; the api-server's log has why)"}}
    return {"watchers": watchers}
