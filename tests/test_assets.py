"""``jetstream://`` assets: registration with Airflow, URI sanitising, OpenLineage conversion,
automatic outlets of the ensure-stream operator."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import Asset
from airflow.sdk.lineage import HookLineageCollector
from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime
from openlineage.client.event_v2 import Dataset as OpenLineageDataset

from airflow_jetstream.assets import jetstream_asset
from airflow_jetstream.assets.jetstream import (
    InvalidAssetURIError,
    convert_asset_to_openlineage,
    create_asset,
    parse_asset_uri,
    report_stream_input,
    report_stream_output,
    sanitize_uri,
)
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator
from tests.support.airflow_cli import dag_test_env, run_airflow


def test_provider_registers_handler_factory_and_converter() -> None:
    manager = ProvidersManagerTaskRuntime()
    assert manager.asset_uri_handlers["jetstream"] is sanitize_uri
    assert manager.asset_factories["jetstream"] is create_asset
    assert manager.asset_to_openlineage_converters["jetstream"] is convert_asset_to_openlineage


@pytest.mark.parametrize(
    ("written", "normalised"),
    [
        ("jetstream://NATS.Example.com/ORDERS", "jetstream://nats.example.com:4222/ORDERS"),
        ("jetstream://nats.example.com:4333/ORDERS/", "jetstream://nats.example.com:4333/ORDERS"),
        ("JETSTREAM://n1/ORDERS/orders.new", "jetstream://n1:4222/ORDERS/orders.new"),
        ("jetstream://n1/ORDERS/orders.%3E", "jetstream://n1:4222/ORDERS/orders.>"),
        ("jetstream://n1/ORDERS/orders.*.eu", "jetstream://n1:4222/ORDERS/orders.*.eu"),
        ("jetstream://[::1]:4222/ORDERS", "jetstream://[::1]:4222/ORDERS"),
    ],
)
def test_airflow_sanitises_jetstream_uris(written: str, normalised: str) -> None:
    assert Asset(written).uri == normalised


@pytest.mark.parametrize(
    ("uri", "complaint"),
    [
        ("jetstream://n1", "names no stream"),
        ("jetstream://n1/", "names no stream"),
        ("jetstream://n1/ORD.ERS", "contains '.'"),
        ("jetstream://n1/ORDERS/orders..new", "empty token"),
        ("jetstream://n1/ORDERS/orders.>.x", "'>' may only be the last token"),
        ("jetstream://n1/ORDERS/orders%20new", "white space"),
        ("jetstream://n1,n2/ORDERS", "exactly one server"),
        ("jetstream://n1/ORDERS?x=1", "no query"),
        ("jetstream://n1:notaport/ORDERS", "invalid port"),
    ],
)
def test_bad_uris_are_rejected_with_the_reason(uri: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint) as caught:
        Asset(uri)
    assert isinstance(caught.value, InvalidAssetURIError)
    assert caught.value.reason == "invalid_asset_uri"


def test_credentials_never_stay_in_an_asset_uri() -> None:
    with pytest.warns(UserWarning, match="password"):
        asset = Asset("jetstream://user:s3cret@n1/ORDERS")
    assert "s3cret" not in asset.uri
    with pytest.raises(InvalidAssetURIError, match="credentials"):
        sanitize_uri(urllib.parse.urlsplit("jetstream://user@n1/ORDERS"))


def test_helper_accepts_connection_style_servers() -> None:
    expected = "jetstream://n1.example.com:4222/ORDERS/orders.new"
    assert jetstream_asset("nats://N1.example.com:4222", "ORDERS", "orders.new").uri == expected
    assert jetstream_asset("tls://n1.example.com", "ORDERS", "orders.new").uri == expected
    assert jetstream_asset(("nats://n1.example.com:4222", "nats://n2:4222"), "ORDERS", "orders.new").uri == expected
    assert jetstream_asset("n1.example.com, n2.example.com", "ORDERS", "orders.new").uri == expected
    assert jetstream_asset("n1", "ORDERS") == Asset("jetstream://n1:4222/ORDERS")
    with pytest.raises(InvalidAssetURIError, match="contains"):
        jetstream_asset("n1", "ORD*")


def test_parse_asset_uri_gives_the_parts() -> None:
    ref = parse_asset_uri("jetstream://n1:5222/ORDERS/orders.eu.>")
    assert (ref.server, ref.stream, ref.subject, ref.name) == ("n1:5222", "ORDERS", "orders.eu.>", "ORDERS/orders.eu.>")
    with pytest.raises(InvalidAssetURIError, match="scheme 'kafka'"):
        parse_asset_uri("kafka://n1/ORDERS")


def test_openlineage_dataset() -> None:
    stream = convert_asset_to_openlineage(jetstream_asset("n1", "ORDERS"), lineage_context=None)
    subject = convert_asset_to_openlineage(jetstream_asset("n1", "ORDERS", "orders.new"), lineage_context=None)
    assert isinstance(stream, OpenLineageDataset)
    assert (stream.namespace, stream.name) == ("jetstream://n1:4222", "ORDERS")
    assert (subject.namespace, subject.name) == ("jetstream://n1:4222", "ORDERS/orders.new")


def test_ensure_stream_operator_sets_its_outlet(nats_server, nats_conn: str) -> None:
    other = Asset("s3://bucket/key")
    op = JetStreamEnsureStreamOperator(
        task_id="ensure", config={"name": "OUTLETS", "subjects": ["outlets.>"]}, outlets=[other]
    )
    op.execute(context={})
    expected = jetstream_asset(nats_server.url, "OUTLETS")
    assert op.outlets == [other, expected]
    op.execute(context={})
    assert op.outlets == [other, expected], "a second run must not add the outlet twice"


def test_ensure_stream_operator_reports_hook_lineage(
    nats_server, nats_conn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a hook-lineage reader (e.g. the OpenLineage provider) Airflow uses a real collector,
    which builds the output through the registered ``jetstream`` factory."""
    import airflow_jetstream.assets.jetstream as assets_module

    collector = HookLineageCollector()
    monkeypatch.setattr(assets_module, "get_hook_lineage_collector", lambda: collector)
    op = JetStreamEnsureStreamOperator(task_id="ensure", config={"name": "LINEAGE", "subjects": ["lineage.>"]})
    op.execute(context={})
    (output,) = collector.collected_assets.outputs
    assert output.asset == jetstream_asset(nats_server.url, "LINEAGE")
    assert output.context is op.hook
    assert collector.create_asset(scheme="jetstream", asset_kwargs={"server": "n1", "stream": "X", "subject": "x.>"}) \
        == Asset("jetstream://n1:4222/X/x.>")


PRODUCER_DAG = """
from datetime import datetime
from airflow.sdk import DAG
from airflow_jetstream.operators.stream import JetStreamEnsureStreamOperator

with DAG(dag_id="jetstream_producer", start_date=datetime(2026, 1, 1), schedule=None):
    JetStreamEnsureStreamOperator(task_id="ensure", config={"name": "ORDERS", "subjects": ["orders.>"]})
"""
CONSUMER_DAG = """
import os
from datetime import datetime
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow_jetstream.assets import jetstream_asset

with DAG(dag_id="jetstream_consumer", start_date=datetime(2026, 1, 1),
         schedule=[jetstream_asset(os.environ["NATS_TEST_SERVER"], "ORDERS")]):
    EmptyOperator(task_id="noop")
"""
QUEUED = """
import json
from sqlalchemy import select
from airflow.models.asset import AssetDagRunQueue, AssetEvent
from airflow.utils.session import create_session

with create_session() as session:
    print(json.dumps({
        "events": [[e.asset.uri, e.source_dag_id, e.source_task_id] for e in session.scalars(select(AssetEvent))],
        "queued": [q.target_dag_id for q in session.scalars(select(AssetDagRunQueue))],
    }))
"""


@pytest.mark.airflow_cli
def test_ensure_stream_run_triggers_a_dag_scheduled_on_the_stream(nats_server, tmp_path: Path) -> None:
    """A real DAG run (``airflow dags test``): the automatic outlet becomes an asset event that
    queues the DAG scheduled on ``jetstream_asset(server, "ORDERS")``."""
    env = dag_test_env(
        tmp_path / "home",
        nats_server.url,
        {"producer.py": PRODUCER_DAG, "consumer.py": CONSUMER_DAG},
        NATS_TEST_SERVER=nats_server.url,
        AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",  # only an unpaused DAG is queued: no `dags unpause` run
    )
    steps = (["dags", "reserialize"], ["dags", "test", "jetstream_producer"])
    for args in steps:
        proc = run_airflow(args, env, cwd=tmp_path)
        assert proc.returncode == 0, f"airflow {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    proc = subprocess.run([sys.executable, "-c", QUEUED], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads(proc.stdout.strip().splitlines()[-1])
    uri = jetstream_asset(nats_server.url, "ORDERS").uri
    assert state["events"] == [[uri, "jetstream_producer", "ensure"]]
    assert state["queued"] == ["jetstream_consumer"]

def test_report_helpers_for_operator_authors(monkeypatch: pytest.MonkeyPatch) -> None:
    """``report_stream_output``/``report_stream_input`` declare outlets/inlets once and feed hook lineage."""
    import airflow_jetstream.assets.jetstream as assets_module

    collector = HookLineageCollector()
    monkeypatch.setattr(assets_module, "get_hook_lineage_collector", lambda: collector)
    task = EmptyOperator(task_id="t")
    servers = ("nats://n1:4222", "nats://n2:4222")
    out = report_stream_output(task, servers, "AGG")
    report_stream_output(task, servers, "AGG")
    inp = report_stream_input(task, servers, "ORDERS", "orders.eu.>")
    assert task.outlets == [out] and out.uri == "jetstream://n1:4222/AGG"
    assert task.inlets == [inp] and inp.uri == "jetstream://n1:4222/ORDERS/orders.eu.>"
    lineage = collector.collected_assets
    assert [(o.asset.uri, o.count) for o in lineage.outputs] == [(out.uri, 2)]
    assert [i.asset.uri for i in lineage.inputs] == [inp.uri]
    assert all(i.context is task for i in lineage.inputs + lineage.outputs)


def test_orders_pipeline_declares_its_streams_so_assets_show_the_graph(monkeypatch) -> None:
    """producer -> ORDERS_RAW -> (source caught up) -> ORDERS_AGG -> consumer, the ledger beside them."""
    from airflow.dag_processing.dagbag import DagBag

    examples = Path(__file__).resolve().parents[1] / "dags_examples"
    monkeypatch.syspath_prepend(str(examples))
    monkeypatch.setenv("JETSTREAM_DEMO_SERVER", "nats.example.com:4333")
    monkeypatch.delitem(sys.modules, "orders_pipeline_common", raising=False)  # read the server again
    bag = DagBag(dag_folder=str(examples / "jetstream_orders_pipeline.py"))
    assert bag.import_errors == {}
    dag = bag.dags["jetstream_orders_pipeline"]
    server = "jetstream://nats.example.com:4333"
    raw, agg, ledger = f"{server}/ORDERS_RAW", f"{server}/ORDERS_AGG", f"{server}/KV_batch_ledger"

    def uris(task_id: str, attribute: str) -> set[str]:
        return {asset.uri for asset in getattr(dag.get_task(task_id), attribute)}

    assert uris("produce_orders", "outlets") == {raw, ledger}
    assert (uris("wait_source_caught_up", "inlets"), uris("wait_source_caught_up", "outlets")) == ({raw}, {agg})
    assert (uris("consume_orders", "inlets"), uris("consume_orders", "outlets")) == ({agg}, {ledger})
    assert uris("wait_batches_consumed", "inlets") == {ledger}
