"""Event-driven DAGs from JetStream, and an advisory guard. They share a server with the orders pipeline.

* ``publish_ready_orders`` creates stream ``ORDERS_READY`` (``orders.ready``) and publishes
  ``params.count`` orders; run it to feed the next DAG.
* ``process_ready_orders`` runs for messages on ``orders.ready`` (durable consumer
  ``airflow_orders_ready``, created by its watcher; the watcher waits, logging one line per
  growing back-off, until ``publish_ready_orders`` created the stream). It processes each stream
  sequence once (``process_each_once``): a message can repeat after a triggerer crash, and it also
  processes the events Airflow stored without starting a run for them (see docs/event-driven.md).
* ``handle_abandoned_batches`` runs for ``batch_abandoned`` advisories of ``ORDERS_GUARDED``,
  read from the advisory capture stream ``ADVISORIES`` (created by ``publish_orders_guarded`` or
  the orders pipeline), and reports each abandoned batch once, also those of a burst that Airflow
  stored without a run of their own.
* ``publish_orders_guarded`` ensures the capture stream and ``ORDERS_GUARDED``
  (``orders.guarded.>``), publishes, and fails if any batch of this run was abandoned.

Watchers are ``MessageQueueTrigger(scheme="jetstream", ...)`` (needs the ``messaging`` extra).
Set ``JETSTREAM_DEMO_SERVER`` (``host:port``) for the asset URIs.
"""

from __future__ import annotations

import json
import os

import pendulum
from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.sdk import DAG, Asset, AssetWatcher, Param, task

from airflow_jetstream.client.advisories import advisory_subject
from airflow_jetstream.operators.advisory import JetStreamAdvisoryStreamOperator
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator
from airflow_jetstream.sensors.advisory import JetStreamAdvisorySensor

NATS_SERVER = os.environ.get("JETSTREAM_DEMO_SERVER", "127.0.0.1:4222")
START = pendulum.datetime(2026, 1, 1, tz="UTC")
READY_STREAM_CONFIG = {"name": "ORDERS_READY", "subjects": ["orders.ready"], "max_age": "7d"}
READY_CONSUMER = "airflow_orders_ready"
READY_ACK_WAIT = os.environ.get("JETSTREAM_DEMO_ACK_WAIT", "30s")
# None: the watcher's batch_size (64); a number bounds the repeat events after a stopped, killed or stalled
# triggerer (docs/event-driven.md)
READY_MAX_UNCONFIRMED = int(os.environ["JETSTREAM_DEMO_MAX_UNCONFIRMED"]) if os.environ.get(
    "JETSTREAM_DEMO_MAX_UNCONFIRMED") else None
PROCESSED_BUCKET = "orders_ready_processed"  # one key per processed stream sequence
REPORTED_BUCKET = "abandoned_batches_reported"  # one key per reported advisory (capture stream sequence)
GUARDED_STREAM = "ORDERS_GUARDED"
CAPTURE_STREAM, CAPTURE_MAX_AGE = "ADVISORIES", "1d"  # the same settings as the orders pipeline's capture task

orders_ready = Asset(
    name="orders_ready",
    uri=f"jetstream://{NATS_SERVER}/ORDERS_READY/orders.ready",
    watchers=[
        AssetWatcher(
            name="orders_ready_watcher",
            trigger=MessageQueueTrigger(
                scheme="jetstream",
                stream="ORDERS_READY",
                consumer=READY_CONSUMER,
                # ack_wait: how soon a message held by a crashed triggerer comes again (a live one keeps it)
                consumer_config={"filter_subject": "orders.ready", "max_ack_pending": 1000, "ack_wait": READY_ACK_WAIT},
                max_unconfirmed=READY_MAX_UNCONFIRMED,
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
                stream=CAPTURE_STREAM,
                consumer="airflow_orders_abandoned",
                advisory="batch_abandoned",
                advisory_stream=GUARDED_STREAM,
                consumer_config={"filter_subject": advisory_subject("batch_abandoned", GUARDED_STREAM),
                                 "deliver_policy": "new"},
            ),
        )
    ],
)


with DAG(dag_id="publish_ready_orders", schedule=None, start_date=START, catchup=False,
         params={"count": Param(5, type="integer", minimum=1, maximum=10_000)},
         tags=["jetstream", "event-driven"]):
    ready_stream = JetStreamEnsureStreamOperator(task_id="ensure_ready_stream", config=READY_STREAM_CONFIG)

    @task
    def publish_ready(params: dict) -> list[int]:
        """Publish ``count`` orders on ``orders.ready``; returns their stream sequences."""
        from airflow_jetstream.hooks.jetstream import JetStreamHook

        async def publish(conn, count: int) -> list[int]:
            return [(await conn.js.publish("orders.ready", json.dumps({"order": i}).encode())).seq
                    for i in range(count)]

        return JetStreamHook().run(publish, params["count"])

    ready_stream >> publish_ready()


with DAG(dag_id="process_ready_orders", schedule=[orders_ready], start_date=START, catchup=False,
         tags=["jetstream", "event-driven"]):

    # retries: a failure before the work (e.g. the api-server busy) leaves no claim, so a retry processes the messages
    @task(inlets=[orders_ready], retries=3, retry_delay=pendulum.duration(seconds=10))
    def process(triggering_asset_events=None, inlet_events=None) -> dict[str, list[int]]:
        """Process each message once, by its stream sequence: a repeat is logged and skipped. Events Airflow
        stored without a run of their own (docs/event-driven.md, "Stranded events") are processed here too."""
        from airflow_jetstream.message_events import asset_messages, process_each_once

        def handle(message: dict) -> None:
            order = (message.get("json") or {}).get("order")  # the order's id, not the whole body, in the task log
            # the claim's token goes with the output: a later claim of the message has a higher one
            print(f"order message {message['stream_seq']} on {message['subject']} (claim {message['claim_revision']}): "
                  f"order {order}")

        messages = asset_messages(orders_ready, triggering_asset_events, inlet_events)
        return process_each_once(messages, handle, bucket=PROCESSED_BUCKET)

    process()


with DAG(dag_id="handle_abandoned_batches", schedule=[orders_batch_abandoned], start_date=START, catchup=False,
         tags=["jetstream", "event-driven", "advisories"]):

    @task(inlets=[orders_batch_abandoned])
    def report(triggering_asset_events=None, inlet_events=None) -> list[str]:
        """One line per abandoned batch, each once. A burst of advisories can leave events without a run of
        their own (docs/event-driven.md, "Stranded events"): the run that left them behind reports them."""
        from airflow_jetstream.message_events import asset_messages, process_each_once

        batches = []

        def handle(message: dict) -> None:
            advisory = message["advisory"]
            print(f"batch {advisory['batch']} of {advisory['stream']} abandoned: {advisory['reason']}")
            batches.append(advisory["batch"])

        messages = asset_messages(orders_batch_abandoned, triggering_asset_events, inlet_events)
        process_each_once(messages, handle, bucket=REPORTED_BUCKET)
        return batches

    report()


with DAG(dag_id="publish_orders_guarded", schedule=None, start_date=START, catchup=False,
         tags=["jetstream", "advisories"]):
    capture = JetStreamAdvisoryStreamOperator(task_id="capture_advisories", capture_stream=CAPTURE_STREAM,
                                              max_age=CAPTURE_MAX_AGE)
    orders_stream = JetStreamEnsureStreamOperator(
        task_id="ensure_orders",
        config={"name": GUARDED_STREAM, "subjects": ["orders.guarded.>"], "allow_atomic": True},
    )

    @task
    def publish_orders() -> int:
        # stands in for the Spark job that publishes this run's atomic batches
        return 0

    no_abandoned_batch = JetStreamAdvisorySensor(
        task_id="no_abandoned_batch",
        advisory="batch_abandoned",
        advisory_stream=GUARDED_STREAM,
        expect="absent",
        quiet_period=15,  # the server abandons an idle batch after ~10 s
        timeout=600,
    )
    capture >> orders_stream >> publish_orders() >> no_abandoned_batch
