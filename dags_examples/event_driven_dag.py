"""Event-driven DAGs from JetStream, and an advisory guard.

* ``process_ready_orders`` runs once per message on ``orders.ready`` (a durable consumer
  ``airflow_orders_ready`` on stream ``ORDERS``; created by the watcher if missing).
* ``handle_abandoned_batches`` runs once per ``batch_abandoned`` advisory of stream ``ORDERS``,
  read from the advisory capture stream ``ADVISORIES`` through a durable consumer.
* ``publish_orders_guarded`` ensures the capture stream, publishes, and fails if any batch of this
  run was abandoned (guard mode of ``JetStreamAdvisorySensor``, deferred to the triggerer).

Watchers are triggers with ``MessageQueueTrigger(scheme="jetstream", ...)`` (needs the
``messaging`` extra). Each message is acked only after its asset event is stored, so a triggerer
restart loses nothing. Set ``JETSTREAM_DEMO_SERVER`` (``host:port``) for the asset URIs.
"""

from __future__ import annotations

import os

import pendulum
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_jetstream.client.advisories.types import advisory_subject
from airflow_jetstream.operators.advisory import JetStreamAdvisoryStreamOperator
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator
from airflow_jetstream.sensors.advisory import JetStreamAdvisorySensor

NATS_SERVER = os.environ.get("JETSTREAM_DEMO_SERVER", "127.0.0.1:4222")
START = pendulum.datetime(2026, 1, 1, tz="UTC")

orders_ready = Asset(
    name="orders_ready",
    uri=f"jetstream://{NATS_SERVER}/ORDERS/orders.ready",
    watchers=[
        AssetWatcher(
            name="orders_ready_watcher",
            trigger=MessageQueueTrigger(
                scheme="jetstream",
                stream="ORDERS",
                consumer="airflow_orders_ready",
                consumer_config={"filter_subject": "orders.ready", "max_ack_pending": 1000},
            ),
        )
    ],
)

orders_batch_abandoned = Asset(
    name="orders_batch_abandoned",
    watchers=[
        AssetWatcher(
            name="orders_batch_abandoned_watcher",
            trigger=MessageQueueTrigger(
                scheme="jetstream",
                stream="ADVISORIES",
                consumer="airflow_orders_abandoned",
                advisory="batch_abandoned",
                advisory_stream="ORDERS",
                consumer_config={"filter_subject": advisory_subject("batch_abandoned", "ORDERS"),
                                 "deliver_policy": "new"},
            ),
        )
    ],
)


with DAG(dag_id="process_ready_orders", schedule=[orders_ready], start_date=START, catchup=False,
         tags=["jetstream", "event-driven"]):

    @task
    def process(triggering_asset_events=None) -> list[int]:
        seqs = []
        for event in triggering_asset_events[orders_ready]:
            message = event.extra["payload"]  # subject, stream_seq, headers, data (+ json when it parses)
            print(f"order message {message['stream_seq']} on {message['subject']}: {message.get('json')}")
            seqs.append(message["stream_seq"])
        return seqs  # stream_seq identifies the message: use it to make processing idempotent

    process()


with DAG(dag_id="handle_abandoned_batches", schedule=[orders_batch_abandoned], start_date=START, catchup=False,
         tags=["jetstream", "event-driven", "advisories"]):

    @task
    def report(triggering_asset_events=None) -> list[str]:
        batches = []
        for event in triggering_asset_events[orders_batch_abandoned]:
            advisory = event.extra["payload"]["advisory"]
            print(f"batch {advisory['batch']} of {advisory['stream']} abandoned: {advisory['reason']}")
            batches.append(advisory["batch"])
        return batches

    report()


with DAG(dag_id="publish_orders_guarded", schedule=None, start_date=START, catchup=False,
         tags=["jetstream", "advisories"]):
    capture = JetStreamAdvisoryStreamOperator(task_id="capture_advisories", stream="ADVISORIES", max_age="7d")
    orders_stream = JetStreamEnsureStreamOperator(
        task_id="ensure_orders",
        config={"name": "ORDERS", "subjects": ["orders.>"], "allow_atomic": True},
    )

    @task
    def publish_orders() -> int:
        # stands in for the Spark job that publishes this run's atomic batches
        return 0

    no_abandoned_batch = JetStreamAdvisorySensor(
        task_id="no_abandoned_batch",
        advisory="batch_abandoned",
        stream="ORDERS",
        expect="absent",
        quiet_period=15,  # the server abandons an idle batch after ~10 s
        deferrable=True,
        timeout=600,
    )
    capture >> orders_stream >> publish_orders() >> no_abandoned_batch
