"""A hub sources a WorkQueue on a leaf node (own JetStream domain) durably, across a leaf crash or restart."""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from airflow_jetstream.client import ConnectionSettings, JetStreamError, ensure_stream, open_connection, stream_info
from airflow_jetstream.client.admin.consumers import find_consumer
from airflow_jetstream.client.admin.streams import api_view
from airflow_jetstream.client.reading.stored import read_messages
from airflow_jetstream.client.sourcing.spec import source_status
from airflow_jetstream.embedded.server import EmbeddedNatsServer, free_port
from airflow_jetstream.operators.sourcing import JetStreamDurableSourceOperator
from tests.conftest import set_nats_connection
from tests.support.polling import wait_until
from tests.test_sourcing import assert_exactly_once, messages, payloads, run, wait_for

TOTAL = 6000


@pytest.fixture
def hub_and_leaf(nats_server_factory):
    leaf_port = free_port()
    hub = nats_server_factory(config={"leafnodes": {"listen": f"127.0.0.1:{leaf_port}"}},
                              jetstream={"domain": "hub"})
    leaf = nats_server_factory(
        config={"leafnodes": {"remotes": [{"url": f"nats-leaf://127.0.0.1:{leaf_port}"}], "reconnect": "1s"}},
        jetstream={"domain": "edge"},
    )
    wait_leaf_connected(hub)
    return hub, leaf


def wait_leaf_connected(hub: EmbeddedNatsServer, timeout: float = 20.0) -> None:
    wait_until(lambda: hub.monitor("leafz").get("leafnodes"), "the leaf node to connect to the hub", timeout)


async def publish_until_acked(conn, count: int, started: asyncio.Event, *, window: int = 100) -> int:
    """Publish o-0..o-<count-1> with msg ids, retrying whatever got no ack (the leaf may be down)."""
    retries = 0
    pending = list(range(count))
    while pending:
        batch, pending = pending[:window], pending[window:]

        async def one(i: int) -> int | None:
            try:
                await conn.js.publish(f"o.{i % 10}", f"o-{i}".encode(), timeout=2,
                                      headers={"Nats-Msg-Id": f"o-{i}"})
            except (nats.errors.Error, TimeoutError, JetStreamError):
                return i
            return None

        failed = [i for i in await asyncio.gather(*(one(i) for i in batch)) if i is not None]
        if failed:
            retries += len(failed)
            pending = failed + pending
            await asyncio.sleep(0.2)
        if count - len(pending) >= count // 3:
            started.set()
    return retries


#: How the leaf goes down while the publisher writes, per source mode. A user-managed source is not crash-safe on
#: nats-server 2.15.1: after a SIGKILL its consumer restarts behind the delivery sequence the aggregate last saw, and
#: the aggregate drops what comes next until the sequences meet, then acknowledges past it (docs/sourcing.md, "A
#: server defect"). So the user-managed case stops the leaf cleanly (SIGTERM: the consumer's state is written out).
LEAF_STOPS = [pytest.param("server", True, id="server-sigkill"), pytest.param("user", False, id="user-sigterm")]


@pytest.mark.parametrize(("mode", "kill"), LEAF_STOPS)
def test_leaf_restart_while_publishing_loses_and_duplicates_nothing(mode, kill, hub_and_leaf, monkeypatch):
    hub, leaf = hub_and_leaf
    hub_settings = ConnectionSettings(servers=hub.url, connect_timeout=2, request_timeout=3)
    leaf_settings = ConnectionSettings(servers=leaf.url, connect_timeout=2, request_timeout=3)
    run(leaf_settings, ensure_stream, {"name": "ORIGIN", "subjects": ["o.>"], "retention": "workqueue"})
    set_nats_connection(monkeypatch, "nats_hub", hub.url)
    result = JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="ORIGIN", domain="edge",
                                            user_managed=mode == "user", nats_conn_id="nats_hub").execute(context={})
    assert result["domain"] == "edge" and result["source_state"]["active"] >= 0
    if mode == "user":
        consumer = run(hub_settings, lambda c: find_consumer(api_view(c, domain="edge"), "ORIGIN", "AGG_SRC_ORIGIN"))
        assert consumer["config"]["ack_policy"] == "flow_control"
    else:
        assert result["consumer"].startswith("JS_SRC_")

    first_pid = leaf.process.pid

    async def scenario() -> int:
        async with open_connection(leaf_settings, max_reconnect_attempts=-1, reconnect_time_wait=0.2) as conn:
            started = asyncio.Event()
            publisher = asyncio.ensure_future(publish_until_acked(conn, TOTAL, started))
            await started.wait()
            await asyncio.to_thread(leaf.stop, kill=kill)
            await asyncio.to_thread(leaf.start)
            return await publisher

    retries = asyncio.run(scenario())
    assert leaf.process.pid != first_pid, "the leaf was not restarted"
    wait_leaf_connected(hub)

    async def check(conn) -> dict:
        leaf_view = api_view(conn, domain="edge")
        last: dict = {}

        async def settled() -> bool:
            last.update(agg=await messages(conn, "AGG"), status=await source_status(conn, "AGG", "ORIGIN",
                                                                                    domain="edge"))
            return last["agg"] >= TOTAL and last["status"]["caught_up"]
        # After failed attempts while the leaf was down, the hub retries a source with a growing back-off
        # (10 s more per failure, at most 2 min: nats-server's calculateRetryBackoff), so allow that plus margin.
        try:
            await wait_for(settled, 180, "AGG to hold every message and the source to be caught up")
        except AssertionError as exc:
            status = await source_status(conn, "AGG", "ORIGIN", domain="edge")
            missing = sorted(set(range(TOTAL)) - {int(p.split("-")[1]) for p in await payloads(conn, "AGG")})
            consumer = await find_consumer(leaf_view, "ORIGIN", status["consumer"]) if status.get("consumer") else None
            origin = (await stream_info(leaf_view, "ORIGIN"))["state"]
            lost = f" (o-{missing[0]}..o-{missing[-1]})" if missing else ""
            raise AssertionError(
                f"{exc}: AGG holds {last.get('agg')} of {TOTAL}; missing {len(missing)}{lost}; source {status}; "
                f"origin state {origin}; origin consumer delivered {consumer and consumer.get('delivered')} ack "
                f"floor {consumer and consumer.get('ack_floor')}; {retries} publish retries") from None
        consumer = await find_consumer(leaf_view, "ORIGIN", last["status"]["consumer"])
        return {"seen": await payloads(conn, "AGG"), "left": await left_in_origin(leaf_view),
                "ack_floor": int(consumer["ack_floor"]["stream_seq"]), "status": last["status"]}

    outcome = run(hub_settings, check)
    assert_exactly_once(outcome["seen"], "o", TOTAL)
    # The origin's consumer has confirmed everything (caught up). A WorkQueue origin can still hold some of those
    # messages after a restart (nats-server 2.15.1, docs/sourcing.md "Messages left in a WorkQueue origin"): each
    # must be one AGG holds, at or below the consumer's ack floor; anything else would be a message not sourced.
    unsourced = {seq: data for seq, data in outcome["left"].items()
                 if seq > outcome["ack_floor"] or data not in outcome["seen"]}
    assert not unsourced, f"ORIGIN holds messages not sourced into AGG: {dict(list(unsourced.items())[:5])}"
    assert outcome["status"]["origin_left_behind"] == len(outcome["left"]), outcome["status"]
    print(f"{mode}: {len(outcome['left'])} already-sourced message(s) left in ORIGIN below the ack floor "
          f"{outcome['ack_floor']}; {retries} publish retries")


async def left_in_origin(conn) -> dict[int, str]:
    """The messages ORIGIN still stores, by stream sequence (read by sequence: a WorkQueue takes no second
    consumer)."""
    messages = await read_messages(conn, "ORIGIN", 1, None, subjects=(">",))  # write fences too
    return {m.seq: m.data.decode() for m in messages}


def test_origin_reached_through_an_api_prefix(hub_and_leaf, monkeypatch):
    """The origin named by its JetStream API prefix instead of its domain (same wire path, no domain name)."""
    hub, leaf = hub_and_leaf
    hub_settings = ConnectionSettings(servers=hub.url, connect_timeout=2, request_timeout=3)
    leaf_settings = ConnectionSettings(servers=leaf.url, connect_timeout=2, request_timeout=3)
    run(leaf_settings, ensure_stream, {"name": "ORIGIN", "subjects": ["o.>"], "retention": "workqueue"})
    set_nats_connection(monkeypatch, "nats_hub", hub.url)
    result = JetStreamDurableSourceOperator(task_id="src", stream="AGG", source="ORIGIN", user_managed=True,
                                            api_prefix="$JS.edge.API", nats_conn_id="nats_hub").execute(context={})
    assert result["api_prefix"] == "$JS.edge.API" and result["domain"] is None

    async def publish_and_wait(conn) -> dict:
        for i in range(100):
            await conn.js.publish(f"o.{i}", str(i).encode())
        return {}

    run(leaf_settings, publish_and_wait)

    async def caught_up(conn) -> dict:
        await wait_for(lambda: _status_caught_up(conn), 30, "the hub to catch up through the API prefix")
        return await source_status(conn, "AGG", "ORIGIN", api_prefix="$JS.edge.API")

    status = run(hub_settings, caught_up)
    assert status["caught_up"] and status["consumer"] == result["consumer"]
    assert run(hub_settings, messages, "AGG") == 100
    with pytest.raises(JetStreamError, match="either the origin's JetStream domain or its API prefix"):
        JetStreamDurableSourceOperator(task_id="bad", stream="AGG", source="ORIGIN", domain="edge",
                                       api_prefix="$JS.edge.API", nats_conn_id="nats_hub").execute(context={})


async def _status_caught_up(conn) -> bool:
    return (await source_status(conn, "AGG", "ORIGIN", api_prefix="$JS.edge.API"))["caught_up"]
