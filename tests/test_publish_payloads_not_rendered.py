"""The publish operator's payloads stay out of the metadata DB and the UI: the ``messages`` template field (in
the serialized DAG and in rendered fields) shows a count, while the task publishes the rendered payloads."""

from __future__ import annotations

import asyncio
import json

from airflow.sdk.execution_time.task_runner import _serialize_rendered_fields

from airflow_jetstream.operators.publish import JetStreamAtomicBatchPublishOperator
from tests.test_publish_operator import admin, stored

SECRET_BODY = "card-4242-4242"
CONTEXT = {"ds": "2026-11-26"}


def _rendered(op: JetStreamAtomicBatchPublishOperator) -> str:
    op.render_template_fields(CONTEXT)
    return json.dumps(_serialize_rendered_fields(op))


def test_a_list_is_rendered_for_publishing_but_never_kept_in_the_field(nats_server, nats_conn) -> None:
    admin(nats_server, lambda conn: asyncio.sleep(0))
    op = JetStreamAtomicBatchPublishOperator(task_id="publish", subject="orders.new", stream="ORDERS", messages=[
        {"data": {"card": SECRET_BODY, "day": "{{ ds }}"}}, {"data": "two"}])
    assert SECRET_BODY not in str(op.messages)  # what the DAG serializer stores
    rendered = _rendered(op)
    assert SECRET_BODY not in rendered and "2 message(s); payloads are not kept in rendered fields" in rendered
    assert op.execute(context={})["count"] == 2
    assert [json.loads(data) if data.startswith(b"{") else data for _, data in stored(nats_server)] == [
        {"card": SECRET_BODY, "day": "2026-11-26"}, b"two"]


def test_a_templated_json_string_is_published_and_summarised(nats_server, nats_conn) -> None:
    admin(nats_server, lambda conn: asyncio.sleep(0))
    text = json.dumps([{"data": {"card": SECRET_BODY, "day": "{{ ds }}"}}])
    op = JetStreamAtomicBatchPublishOperator(task_id="publish", subject="orders.new", stream="ORDERS", messages=text)
    rendered = _rendered(op)
    assert SECRET_BODY not in rendered and "characters of JSON; payloads are not kept" in rendered
    assert op.execute(context={})["count"] == 1
    assert [json.loads(data) for _, data in stored(nats_server)] == [{"card": SECRET_BODY, "day": "2026-11-26"}]
