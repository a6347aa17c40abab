"""JetStreamMessageQueueProvider: ``MessageQueueTrigger(scheme="jetstream", ...)`` for event-driven DAGs.

Needs the ``messaging`` extra (``pip install 'airflow-jetstream[messaging]'``), which brings
``apache-airflow-providers-common-messaging``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.providers.common.compat.sdk import AirflowOptionalProviderFeatureException

try:
    from airflow.providers.common.messaging.providers.base_provider import BaseMessageQueueProvider
except ImportError as exc:
    raise AirflowOptionalProviderFeatureException(
        "JetStreamMessageQueueProvider needs apache-airflow-providers-common-messaging: "
        "pip install 'airflow-jetstream[messaging]'"
    ) from exc

from airflow_jetstream.triggers.message import JetStreamMessageTrigger

if TYPE_CHECKING:
    from airflow.triggers.base import BaseEventTrigger


class JetStreamMessageQueueProvider(BaseMessageQueueProvider):
    """Scheme ``jetstream``: DAG runs from messages on a JetStream durable consumer.

    The keyword arguments of ``MessageQueueTrigger(scheme="jetstream", ...)`` go to
    :class:`~airflow_jetstream.triggers.message.JetStreamMessageTrigger` (docs/event-driven.md).
    """

    scheme = "jetstream"

    def trigger_class(self) -> type[BaseEventTrigger]:
        return JetStreamMessageTrigger
