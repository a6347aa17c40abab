"""Messages in plain Python tasks, the way the Kafka provider works, in JetStream's terms.

``kafka_style_orders`` (trigger it manually; ``params.orders`` sets how many):

1. ensure the stream ``EVENTS_ORDERS`` (subjects ``events.orders.>``, atomic batches allowed);
2. publish orders from a generator (``producer_function``; deterministic msg ids, so a retry
   does not publish twice);
3. wait until the last order has arrived (``JetStreamMessageSensor``: a function over the stream,
   the matching message goes to XCom);
4. bill every order in a Python function (``JetStreamConsumeOperator`` on the durable consumer
   ``events_billing``: each message is acked after the function returned; a failure naks it and
   the task retry continues where it stopped);
5. write the run's count to the KV bucket ``KV_pipeline`` (``JetStreamKeyValueOperator``);
6. wait until the key says the run is billed (``JetStreamKeyValueSensor``).

The KV sensor defers when ``[operators] default_deferrable`` is true. The message sensor pokes: its
function lives in this DAG file, which a triggerer cannot import by a dotted path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pendulum
from airflow.sdk import DAG, Param

from airflow_jetstream.operators.consume import JetStreamConsumeOperator
from airflow_jetstream.operators.kv import JetStreamKeyValueOperator
from airflow_jetstream.operators.publish import JetStreamAtomicBatchPublishOperator
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator
from airflow_jetstream.sensors.kv import JetStreamKeyValueSensor
from airflow_jetstream.sensors.message import JetStreamMessageSensor

STREAM = "EVENTS_ORDERS"
SUBJECT = "events.orders.created"
BUCKET = "KV_pipeline"
log = logging.getLogger(__name__)


def generate_orders(count: int) -> Iterator[dict[str, Any]]:
    """producer_function: one message per order."""
    for order in range(1, int(count) + 1):
        yield {"subject": SUBJECT, "data": {"order": order, "total": order * 10}}


def is_order(message: Any, order: int) -> bool:
    """The message sensor's function: the order with this id arrived."""
    return message.json().get("order") == int(order)


def bill(message: Any, currency: str) -> None:
    """The consume operator's function, once per message; raising naks the message and fails the task."""
    order = message.json()
    log.info("Billing order %s: %s %s (stream seq %d)", order["order"], order["total"], currency, message.seq)


with DAG(
    dag_id="kafka_style_orders",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    schedule=None,
    catchup=False,
    params={"orders": Param(20, type="integer", minimum=1, maximum=1000)},
    tags=["jetstream", "example"],
) as dag:
    ensure = JetStreamEnsureStreamOperator(
        task_id="ensure_stream",
        config={"name": STREAM, "subjects": ["events.orders.>"], "allow_atomic": True, "max_age": "7d"},
    )
    publish = JetStreamAtomicBatchPublishOperator(
        task_id="publish_orders",
        stream=STREAM,
        producer_function=generate_orders,
        producer_function_args=["{{ params.orders }}"],
        split=True,
    )
    last_order_arrived = JetStreamMessageSensor(
        task_id="last_order_arrived",
        stream=STREAM,
        filter_subject=SUBJECT,
        apply_function=is_order,
        apply_function_kwargs={"order": "{{ params.orders }}"},
        start="first",
        deferrable=False,  # to defer, pass "your_pkg.module.is_order": the triggerer imports it by that path
        poke_interval=5,
        timeout=600,
    )
    bill_orders = JetStreamConsumeOperator(
        task_id="bill_orders",
        stream=STREAM,
        consumer="events_billing",
        filter_subjects=[SUBJECT],
        apply_function=bill,
        apply_function_kwargs={"currency": "EUR"},
        max_messages=1000,
        fetch_timeout=2,
        retries=2,
    )
    record_run = JetStreamKeyValueOperator(
        task_id="record_run",
        bucket=BUCKET,
        key="orders.{{ run_id | replace(':', '-') | replace('+', '-') }}",
        value='{"billed": {{ ti.xcom_pull(task_ids="bill_orders")["processed"] }}}',
        bucket_config={"history": 5, "ttl": "30d"},
    )
    run_billed = JetStreamKeyValueSensor(
        task_id="run_billed",
        bucket=BUCKET,
        key="orders.{{ run_id | replace(':', '-') | replace('+', '-') }}",
        poke_interval=5,
        timeout=600,
    )

    ensure >> publish >> last_order_arrived >> bill_orders >> record_run >> run_billed
