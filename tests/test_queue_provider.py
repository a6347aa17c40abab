"""Event-driven scheduling: JetStreamMessageQueueProvider and the shared-stream message trigger.

The triggerer's side is reproduced with Airflow's own ``SharedStreamManager`` through its public API only, driven
as ``TriggerRunner.run_trigger`` drives it (subscribe, filter_shared_stream, bind_pending_event, and
``confirm_persisted`` once an event is "stored"), against a real nats-server. The real triggerer runs these
triggers in tests/test_airflow_deployment.py and tests/test_airflow_failover.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import nats.js.errors
import pytest
from airflow.triggers.shared_stream import SharedStreamManager, reject_shared_stream_event

from airflow_jetstream.client import ConnectionSettings, ensure_stream, open_connection
from airflow_jetstream.client.admin.consumers import consumer_info, ensure_consumer
from airflow_jetstream.client.advisories.capture import capture_stream_config
from airflow_jetstream.client.errors import ConsumerConfigError, ConsumerNotFoundError
from airflow_jetstream.client.reading.messages import Message
from airflow_jetstream.triggers import message as message_module
from airflow_jetstream.triggers.message import JetStreamMessageTrigger
from tests.support.nats_calls import call_on_server as server_call
from tests.support.polling import async_wait_until, wait_until

STREAM, CONSUMER = "ORDERS", "airflow_orders"


class FakeTriggerer:
    """The shared-stream part of Airflow's TriggerRunner: one manager, one task per trigger."""

    def __init__(self, *, persist: bool = True, ack_timeout: float = 30.0,
                 reject: Callable[[Message], bool] | None = None) -> None:
        self.manager = SharedStreamManager(ack_timeout=ack_timeout)
        self.persist = persist
        self.reject = reject
        self.stored: list[tuple[int, dict[str, Any]]] = []  # what reached "the metadata database"
        self.emitted = 0
        self.failures: list[BaseException] = []
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, trigger_id: int, trigger: JetStreamMessageTrigger) -> None:
        self.tasks.append(asyncio.create_task(self._run(trigger_id, trigger)))

    async def _run(self, trigger_id: int, trigger: JetStreamMessageTrigger) -> None:
        key = trigger.shared_stream_key()
        stream = self.manager.subscribe(trigger_id=trigger_id, trigger=trigger, key=key)
        if self.reject is not None:
            stream = self._rejecting(stream)
        try:
            async for event in trigger.filter_shared_stream(stream):
                seq = self.manager.bind_pending_event(trigger_id=trigger_id, key=key)
                self.emitted += 1
                if self.persist:
                    self.stored.append((trigger_id, event.payload))
                    if seq is not None:
                        self.manager.confirm_persisted([seq])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failures.append(exc)
        finally:
            await self.manager.unsubscribe(trigger_id, key)

    async def _rejecting(self, stream):
        async for message in stream:
            if self.reject(message):
                reject_shared_stream_event()
                continue
            yield message

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.manager.stop_all()

    def seqs(self, trigger_id: int | None = None) -> list[int]:
        return [p["stream_seq"] for t, p in self.stored if trigger_id is None or t == trigger_id]


class Replica(threading.Thread):
    """A triggerer replica: its own thread, event loop and NATS connection."""

    def __init__(self, triggers: dict[int, JetStreamMessageTrigger], **kwargs: Any) -> None:
        super().__init__(daemon=True)
        self.triggers = triggers
        self.kwargs = kwargs
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.fake: FakeTriggerer | None = None
        self._done: asyncio.Event | None = None

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        self.fake = FakeTriggerer(**self.kwargs)
        for trigger_id, trigger in self.triggers.items():
            self.fake.start(trigger_id, trigger)
        self.ready.set()
        await self._done.wait()
        await self.fake.stop()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._done.set)
        self.join(30)
        assert not self.is_alive(), f"the replica did not stop within 30s; its tasks:\n{self._task_stacks()}"

    def _task_stacks(self) -> str:
        """Where each task of the replica's loop waits (to tell why it did not stop)."""
        stacks: concurrent.futures.Future[str] = concurrent.futures.Future()

        def collect() -> None:
            out = io.StringIO()
            for task in asyncio.all_tasks():
                task.print_stack(limit=3, file=out)
            stacks.set_result(out.getvalue())

        self.loop.call_soon_threadsafe(collect)
        return stacks.result(10)




async def _publish(conn, count: int, start: int = 0, subject: str = "orders.ready") -> None:
    for i in range(start, start + count):
        await conn.js.publish(subject, json.dumps({"order": i}).encode())


def publish(settings: ConnectionSettings, count: int, start: int = 0, subject: str = "orders.ready") -> None:
    server_call(settings, _publish, count, start, subject)


def consumer_state(settings: ConnectionSettings) -> dict[str, Any]:
    return server_call(settings, consumer_info, STREAM, CONSUMER)


def waiting_pulls(settings: ConnectionSettings) -> int:
    """Pull requests waiting on the consumer (0 while the consumer does not exist yet)."""
    try:
        return consumer_state(settings)["num_waiting"]
    except ConsumerNotFoundError:
        return 0


@pytest.fixture
def orders(settings: ConnectionSettings, nats_conn: str) -> ConnectionSettings:
    server_call(settings, ensure_stream, {"name": STREAM, "subjects": ["orders.>"]})
    return settings


def make_trigger(**kwargs: Any) -> JetStreamMessageTrigger:
    kwargs.setdefault("consumer_config", {"filter_subject": "orders.>"})
    return JetStreamMessageTrigger(stream=STREAM, consumer=CONSUMER, fetch_timeout=0.5, **kwargs)


def test_scheme_resolves_to_the_jetstream_trigger():
    from airflow.providers.common.messaging.triggers.msg_queue import MESSAGE_QUEUE_PROVIDERS, MessageQueueTrigger

    from airflow_jetstream.queues.jetstream import JetStreamMessageQueueProvider

    assert any(isinstance(p, JetStreamMessageQueueProvider) for p in MESSAGE_QUEUE_PROVIDERS)
    queue_trigger = MessageQueueTrigger(scheme="jetstream", stream=STREAM, consumer=CONSUMER, filter_subject="orders.*")
    classpath, kwargs = queue_trigger.serialize()
    assert classpath == "airflow_jetstream.triggers.message.JetStreamMessageTrigger"
    rebuilt = JetStreamMessageTrigger(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert rebuilt.shared_stream_key() == ("jetstream", "nats_default", STREAM, CONSUMER)
    json.dumps(kwargs)


def test_queue_module_is_importable_and_the_provider_is_registered():
    from airflow_jetstream.get_provider_info import get_provider_info

    assert "airflow_jetstream.queues.jetstream.JetStreamMessageQueueProvider" in get_provider_info()["queues"]
    code = ("import sys; sys.modules['airflow.providers.common.messaging.providers.base_provider'] = None\n"
            "import airflow_jetstream.queues, airflow_jetstream.triggers.message\n"
            "try:\n    import airflow_jetstream.queues.jetstream\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "AirflowOptionalProviderFeatureException" in out.stdout and "[messaging]" in out.stdout


def test_events_for_published_messages_acked_only_after_persistence(orders):
    async def scenario(persist: bool, expected: int):
        fake = FakeTriggerer(persist=persist)
        fake.start(1, make_trigger())
        async with open_connection(orders) as conn:
            await _publish(conn, 5)
        await async_wait_until(lambda: fake.emitted >= expected, f"{expected} events emitted", timeout=30)
        if persist:
            await asyncio.to_thread(wait_until, lambda: consumer_state(orders)["ack_floor"]["stream_seq"] >= expected,
                                    "acks of every message")
        state = await asyncio.to_thread(consumer_state, orders)
        await fake.stop()
        return fake, state

    unpersisted, state = asyncio.run(scenario(persist=False, expected=5))
    assert unpersisted.emitted == 5 and not unpersisted.stored
    assert state["ack_floor"]["stream_seq"] == 0 and state["num_ack_pending"] == 5  # nothing acked unpersisted
    # the stop gave them back (nak): the next triggerer gets the same 5 messages at once, then 5 new ones
    persisted, state = asyncio.run(scenario(persist=True, expected=10))
    payloads = [p for _, p in persisted.stored]
    assert sorted(p["stream_seq"] for p in payloads) == list(range(1, 11))
    redelivered = [p for p in payloads if p["stream_seq"] <= 5]
    assert all(p["delivered"] >= 2 for p in redelivered)
    assert payloads[0]["subject"] == "orders.ready" and "json" not in payloads[0], "a reference, not the body"
    assert state["num_ack_pending"] == 0


def test_several_watchers_share_one_consumer_subscription(orders, monkeypatch):
    producers = []  # Airflow asks the trigger class for one producer (one pull loop) per shared stream
    make_producer = JetStreamMessageTrigger.create_shared_stream_producer

    def counted(kwargs):
        producers.append(kwargs)
        return make_producer(kwargs)

    monkeypatch.setattr(JetStreamMessageTrigger, "create_shared_stream_producer", counted)

    async def scenario():
        fake = FakeTriggerer()
        fake.start(1, make_trigger(filter_subject="orders.ready"))
        fake.start(2, make_trigger(filter_subject="orders.*"))
        fake.start(3, make_trigger(filter_subject="orders.cancelled"))
        async with open_connection(orders) as conn:
            await _publish(conn, 4, subject="orders.ready")
            await _publish(conn, 2, start=4, subject="orders.cancelled")
        await async_wait_until(lambda: len(fake.stored) >= 4 + 6 + 2, "12 events for the three watchers",
                               timeout=20)
        await fake.stop()
        return fake

    fake = asyncio.run(scenario())
    assert len(producers) == 1, producers
    assert fake.seqs(1) == [1, 2, 3, 4] and fake.seqs(2) == [1, 2, 3, 4, 5, 6] and fake.seqs(3) == [5, 6]
    state = consumer_state(orders)
    assert state["delivered"]["consumer_seq"] == 6  # each message pulled once for all three watchers
    assert state["ack_floor"]["stream_seq"] == 6


def test_rejected_message_is_terminated_not_redelivered(orders):
    async def scenario():
        fake = FakeTriggerer(reject=lambda m: m.json()["order"] == 1)
        fake.start(1, make_trigger())
        async with open_connection(orders) as conn:
            await _publish(conn, 3)
        await async_wait_until(lambda: len(fake.stored) >= 2, "the two events not rejected", timeout=20)
        await asyncio.to_thread(wait_until, lambda: consumer_state(orders)["num_ack_pending"] == 0, "term + acks")
        await fake.stop()
        return fake

    fake = asyncio.run(scenario())
    assert fake.seqs() == [1, 3]
    state = consumer_state(orders)
    assert state["num_redelivered"] == 0 and state["ack_floor"]["stream_seq"] == 3


def test_failed_watcher_gets_the_message_again(orders):
    async def scenario():
        fake = FakeTriggerer(persist=False, ack_timeout=0.5)  # never confirmed: Airflow fails the subscriber
        fake.start(1, make_trigger())
        async with open_connection(orders) as conn:
            await _publish(conn, 1)
        await async_wait_until(lambda: fake.failures, "the ack timeout failing the watcher", timeout=20)
        await fake.stop()
        return fake

    fake = asyncio.run(scenario())
    assert type(fake.failures[0]).__name__ == "AckTimeout"
    state = consumer_state(orders)
    assert state["ack_floor"]["stream_seq"] == 0  # not acked: it will come again
    assert state["num_pending"] + state["num_ack_pending"] + state["num_redelivered"] >= 1


def test_consumer_must_be_an_explicit_ack_pull_consumer(orders):
    async def scenario(trigger):
        fake = FakeTriggerer()
        fake.start(1, trigger)
        await async_wait_until(lambda: fake.failures, "the watcher's failure on the wrong consumer", timeout=10)
        await fake.stop()
        return fake.failures

    wrong = asyncio.run(scenario(JetStreamMessageTrigger(stream=STREAM, consumer="noack",
                                                         consumer_config={"ack_policy": "none"})))
    assert isinstance(wrong[0], ConsumerConfigError) and wrong[0].reason == "not_explicit_pull_consumer"


def test_a_missing_stream_or_consumer_is_waited_out_and_said_once_per_cause(orders, monkeypatch, caplog):
    """No failure (Airflow would restart the watcher every 2 s with a traceback): the watcher retries with a growing
    back-off, says a cause once at WARNING (issue 39: a watcher waiting for a stream that did not exist yet logged
    the same error 22 times) and its retries at DEBUG, says the next cause once too, and starts once both exist."""
    monkeypatch.setattr(message_module, "BACKOFF_FIRST", 0.1)
    monkeypatch.setattr(message_module, "BACKOFF_MAX", 0.4)  # doubles over the three retries checked, then stays
    stream = "NOT_YET"

    def waits(level: int) -> list[logging.LogRecord]:
        return [r for r in caplog.records if "not started" in r.getMessage() and r.levelno == level]

    async def scenario():
        fake = FakeTriggerer()
        fake.start(1, JetStreamMessageTrigger(stream=stream, consumer=CONSUMER, fetch_timeout=0.5))
        await async_wait_until(lambda: len(waits(logging.DEBUG)) >= 3, timeout=20, what="three retries")
        async with open_connection(orders) as conn:
            await ensure_stream(conn, {"name": stream, "subjects": ["not_yet.>"]})
            await async_wait_until(lambda: any("consumer_not_found" in r.getMessage() for r in waits(logging.WARNING)),
                                   timeout=20, what="the missing consumer said")
            await async_wait_until(lambda: len(waits(logging.DEBUG)) >= 5, timeout=20, what="its retries")
            await ensure_consumer(conn, stream, {"durable_name": CONSUMER, "ack_policy": "explicit"})
            await conn.js.publish("not_yet.1", b"{}")
        await async_wait_until(lambda: fake.stored, timeout=30, what="the event after the consumer was created")
        await fake.stop()
        async with open_connection(orders) as conn:
            await conn.api_request(f"STREAM.DELETE.{stream}")
        return fake

    with caplog.at_level(logging.DEBUG, logger=message_module.__name__):
        fake = asyncio.run(scenario())
    assert fake.failures == [] and len(fake.stored) == 1
    said = waits(logging.WARNING)
    assert [r.getMessage().split("(")[-1].split(")")[0] for r in said] == ["stream_not_found", "consumer_not_found"]
    assert all(r.exc_info is None for r in said), "a back-off line carries no traceback"
    retries = waits(logging.DEBUG)
    delays = [float(r.getMessage().rsplit("; retry ", 1)[1].split(" in ")[1].split(" s")[0]) for r in retries[:3]]
    assert delays == sorted(delays) and delays[0] < delays[2], delays


def test_advisories_through_the_capture_stream(settings, nats_conn):
    server_call(settings, ensure_stream, capture_stream_config("ADVISORIES", max_age="1h"))

    async def scenario():
        fake = FakeTriggerer()
        fake.start(1, JetStreamMessageTrigger(stream="ADVISORIES", consumer="airflow_adv", advisory="stream_created",
                                              advisory_stream="WATCHED", fetch_timeout=0.5,
                                              consumer_config={"deliver_policy": "new"}))
        await asyncio.to_thread(wait_until, lambda: _has_consumer(settings, "ADVISORIES", "airflow_adv"), "consumer")
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "IGNORED", "subjects": ["ignored.>"]})
            await ensure_stream(conn, {"name": "WATCHED", "subjects": ["watched.>"]})
        await async_wait_until(lambda: fake.stored, "the stream_created advisory of WATCHED", timeout=20)
        await fake.stop()
        return fake

    fake = asyncio.run(scenario())
    assert len(fake.stored) == 1
    advisory = fake.stored[0][1]["advisory"]
    assert advisory["advisory_kind"] == "stream_created" and advisory["stream"] == "WATCHED"


def _has_consumer(settings, stream, name) -> bool:
    try:
        server_call(settings, consumer_info, stream, name)
    except ConsumerNotFoundError:
        return False
    return True


def test_two_triggerer_replicas_lose_nothing_and_duplicate_nothing(orders):
    trigger_kwargs = {"batch_size": 8}
    replicas = [Replica({1: make_trigger(**trigger_kwargs)}) for _ in range(2)]
    for replica in replicas:
        replica.start()
        assert replica.ready.wait(30), "a triggerer replica did not start its watcher within 30s"
    # both replicas run the same watcher and have a pull request waiting on the same durable consumer
    wait_until(lambda: waiting_pulls(orders) >= 2, "two waiting pull requests")
    total = 300
    for start in range(0, total, 50):
        publish(orders, 50, start=start)
    wait_until(lambda: sum(len(r.fake.stored) for r in replicas) >= total, "every message as an event")
    wait_until(lambda: consumer_state(orders)["ack_floor"]["stream_seq"] == total, "every ack")
    for replica in replicas:
        replica.stop()
    seqs = replicas[0].fake.seqs() + replicas[1].fake.seqs()
    assert sorted(seqs) == list(range(1, total + 1))  # none lost, none twice
    assert all(r.fake.seqs() for r in replicas), "both replicas should have handled part of the stream"
    assert not any(r.fake.failures for r in replicas)
    state = consumer_state(orders)
    assert state["num_ack_pending"] == 0 and state["num_redelivered"] == 0


def test_replica_stopping_mid_stream_hands_over_without_loss_or_duplicates(orders):
    replicas = [Replica({1: make_trigger(batch_size=4)}) for _ in range(2)]
    for replica in replicas:
        replica.start()
        assert replica.ready.wait(30), "a triggerer replica did not start its watcher within 30s"
    wait_until(lambda: waiting_pulls(orders) >= 2, "two waiting pull requests")
    publish(orders, 100)
    replicas[0].stop()  # e.g. a rolling restart of one triggerer while messages flow
    publish(orders, 100, start=100)
    wait_until(lambda: consumer_state(orders)["ack_floor"]["stream_seq"] == 200, "every ack")
    replicas[1].stop()
    seqs = replicas[0].fake.seqs() + replicas[1].fake.seqs()
    assert sorted(seqs) == list(range(1, 201))


def test_message_handed_out_while_the_last_watcher_leaves_is_given_back_at_once(orders, monkeypatch):
    """Airflow's manager can broadcast a message to nobody between the last watcher's unsubscribe and the poll's
    cancellation (a triggerer stopping mid-stream). Left unacknowledged, the next triggerer got it only after ack_wait
    (10 minutes by default); given back when the producer closes, it gets it at once."""
    gate = asyncio.Event()
    make_producer = JetStreamMessageTrigger.create_shared_stream_producer
    producers = []

    def held_at_the_gate(kwargs):
        producer = make_producer(kwargs)
        opened = producer.open_stream

        async def open_stream():
            async for item in opened():
                await gate.wait()  # the test chooses the loop turn on which the poll hands the message out
                yield item

        producer.open_stream = open_stream
        producers.append(producer)
        return producer

    monkeypatch.setattr(JetStreamMessageTrigger, "create_shared_stream_producer", held_at_the_gate)

    async def scenario() -> FakeTriggerer:
        manager, trigger = SharedStreamManager(), make_trigger()
        manager.subscribe(trigger_id=1, trigger=trigger, key=trigger.shared_stream_key())
        async with open_connection(orders) as conn:
            await _publish(conn, 1)
        await async_wait_until(lambda: producers and producers[0]._outstanding, "the message pulled, held at the gate")
        gate.set()  # the poll hands it out on the loop's next turn: after the unsubscribe below, before the cancel
        await manager.unsubscribe(1, trigger.shared_stream_key())
        following = FakeTriggerer()
        following.start(1, make_trigger())
        await async_wait_until(lambda: following.stored, "the message at the next triggerer", timeout=20)
        await following.stop()
        return following

    following = asyncio.run(scenario())
    assert [(p["stream_seq"], p["delivered"]) for _, p in following.stored] == [(1, 2)]


CRASHING_TRIGGERER = """
import asyncio, json, sys
from airflow.triggers.shared_stream import SharedStreamManager
from airflow_jetstream.triggers.message import JetStreamMessageTrigger

async def main():
    manager = SharedStreamManager()
    trigger = JetStreamMessageTrigger(**json.loads(sys.argv[1]))
    key = trigger.shared_stream_key()
    async for event in trigger.filter_shared_stream(manager.subscribe(trigger_id=1, trigger=trigger, key=key)):
        manager.bind_pending_event(trigger_id=1, key=key)  # never persisted: the process dies first
        print(event.payload["stream_seq"], flush=True)

asyncio.run(main())
"""


def test_triggerer_crash_loses_nothing(orders):
    trigger = make_trigger(consumer_config={"filter_subject": "orders.>", "ack_wait": "1s"})
    _, kwargs = trigger.serialize()
    crashing = subprocess.Popen([sys.executable, "-c", CRASHING_TRIGGERER, json.dumps(kwargs)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())
    try:
        wait_until(lambda: waiting_pulls(orders) >= 1, "the first triggerer", timeout=90)
        publish(orders, 20)
        wait_until(lambda: consumer_state(orders)["num_ack_pending"] == 20, "all 20 delivered to the first triggerer")
    finally:
        crashing.send_signal(signal.SIGKILL)
        crashing.communicate(timeout=30)

    async def restarted():
        fake = FakeTriggerer()
        fake.start(1, JetStreamMessageTrigger(**kwargs))
        await async_wait_until(lambda: len(fake.stored) >= 20, "the 20 redelivered events", timeout=30)
        await asyncio.to_thread(wait_until, lambda: consumer_state(orders)["ack_floor"]["stream_seq"] == 20, "acks")
        await fake.stop()
        return fake

    fake = asyncio.run(restarted())
    assert sorted(set(fake.seqs())) == list(range(1, 21))
    assert all(p["delivered"] >= 2 for _, p in fake.stored)  # redelivered after the crash
    # with ack_wait 1 s, a restarted triggerer stalled for a second before it acknowledged gets the message again
    # (at least once, by design); each delivery is stored once
    deliveries = [(p["stream_seq"], p["delivered"]) for _, p in fake.stored]
    assert len(deliveries) == len(set(deliveries)), deliveries


def test_standalone_run_is_refused():
    async def scenario():
        await anext(make_trigger().run())

    with pytest.raises(NotImplementedError, match="shared-stream manager"):
        asyncio.run(scenario())


def test_unwatched_capture_stream_message_is_not_naked_into_a_feedback_loop(settings, nats_conn):
    """With no watcher subscribed, a message is left for redelivery, not naked: a nak raises a MSG_NAKED
    advisory that a watched advisory capture stream would store as a new message, without end."""
    from airflow.triggers.shared_stream import AdvanceItem, AdvanceOutcome

    from airflow_jetstream.triggers.message import JetStreamSharedStreamProducer

    server_call(settings, ensure_stream, capture_stream_config("ADVISORIES", max_age="1h"))

    async def scenario() -> tuple[bool, dict]:
        producer = JetStreamSharedStreamProducer(
            nats_conn_id="nats_default", stream="ADVISORIES", consumer="airflow_adv", fetch_timeout=0.5,
            consumer_config={"deliver_policy": "new", "ack_policy": "explicit", "ack_wait": 60})
        events = producer.open_stream()
        first = asyncio.ensure_future(anext(events))
        await async_wait_until(lambda: asyncio.to_thread(_has_consumer, settings, "ADVISORIES", "airflow_adv"),
                               "the producer's consumer")
        async with open_connection(settings) as conn:
            await ensure_stream(conn, {"name": "WATCHED", "subjects": ["watched.>"]})
        _payload, token = await asyncio.wait_for(first, 20)
        naked_subject = "$JS.EVENT.ADVISORY.CONSUMER.MSG_NAKED.ADVISORIES.airflow_adv"
        async with open_connection(settings) as conn:
            await producer.advance([AdvanceItem(broker_payload=token, outcome=AdvanceOutcome(acked=0, failed=0))])
            await producer._conn.nc.flush()
            info = await consumer_info(conn, "ADVISORIES", "airflow_adv")  # a round trip after the advance
            try:
                await conn.js.get_last_msg("ADVISORIES", naked_subject)
                naked = True
            except nats.js.errors.NotFoundError:
                naked = False
        await events.aclose()
        await producer.aclose()
        return naked, info

    naked, info = asyncio.run(scenario())
    assert naked is False, "advancing an unwatched message must not publish a MSG_NAKED advisory"
    assert info["num_ack_pending"] >= 1, "the message stays unacknowledged for redelivery"
