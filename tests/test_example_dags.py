"""The example DAGs: they import cleanly, and the orders pipeline + replay run end to end
(`airflow dags test`, real nats-server, Spark local[2]) exactly as `make demo` runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "dags_examples"


def test_all_example_dags_import_without_errors(monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.syspath_prepend(str(EXAMPLES))  # Airflow puts the DAGs folder on sys.path the same way

    bag = DagBag(dag_folder=str(EXAMPLES))
    assert bag.import_errors == {}
    assert {"jetstream_orders_pipeline", "jetstream_orders_replay", "jetstream_orders_incremental"} <= set(bag.dag_ids)


@pytest.mark.spark
@pytest.mark.airflow_cli
def test_orders_pipeline_and_replay_end_to_end(nats_server, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from run_demo import run_pipeline

    rows = 3000
    summary = run_pipeline(tmp_path, nats_server.url, conf={"rows": rows}, log=lambda _msg: None)
    assert summary["rows_produced"] == rows
    assert summary["messages_in_aggregate"] == rows
    assert summary["messages_left_in_raw"] == 0
    assert summary["rows_consumed"] == rows and summary["distinct_orders"] == rows
    assert summary["batches"] == 4  # 4 Spark partitions of 750 rows, one atomic batch each
    assert summary["batches_by_state"] == {"consumed": summary["batches"]}
    totals = Path(summary["output_path"])
    assert any(totals.glob("*.parquet"))

    replay = run_pipeline(tmp_path, nats_server.url, dag_id="jetstream_orders_replay",
                          conf={"from_seq": rows // 2 + 1}, summary_name="replay_summary.json",
                          log=lambda _msg: None)
    assert replay["replayed_from_seq"] == rows // 2 + 1
    assert replay["rows_consumed"] == rows - rows // 2
    assert replay["distinct_orders"] == replay["rows_consumed"]
    first_run = json.loads((totals.parent / "consume_summary.json").read_text())
    assert first_run["rows_consumed"] == rows
