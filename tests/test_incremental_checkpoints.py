"""Which checkpoint a run of ``jetstream_orders_incremental`` starts from (dags_examples/spark_apps/stream_orders.py).

Under Airflow 3's default cron timetable a run's data interval has length 0 (start == end): the step used to
take ``<root>/<interval start>`` as the previous run's checkpoint, which was then its own folder, deleted before
it was copied (``FileNotFoundError`` on the first scheduled run). Now the previous run is the newest checkpoint
of an earlier interval end, whatever the timetable, also after hours without a run.
(The Spark side runs in tests/test_spark_streaming.py; the scheduler side in tests/test_airflow_first_contact.py.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dags_examples" / "spark_apps"))
from stream_orders import SEED, checkpoint_for

H = "2026-11-27T{:02d}:00:00+00:00"


def _run(root: Path, hour: int, progress: str | None = None) -> Path:
    """One run's step: its checkpoint, with ``progress`` written into it as Spark would (offsets/commits)."""
    work = checkpoint_for(root, H.format(hour))
    if progress is not None:
        (work / "progress").write_text(progress)
    return work


def test_the_first_run_starts_from_a_seed_holding_the_query_id(tmp_path: Path) -> None:
    work = _run(tmp_path, 7)
    assert work == tmp_path / "2026-11-27T070000+0000"
    query_id = json.loads((work / "metadata").read_text())["id"]
    assert json.loads((tmp_path / SEED / "metadata").read_text())["id"] == query_id
    assert json.loads((_run(tmp_path, 7) / "metadata").read_text())["id"] == query_id, "a re-run keeps it"


def test_each_run_continues_from_the_previous_one(tmp_path: Path) -> None:
    _run(tmp_path, 7, "up to 07:00")
    assert (_run(tmp_path, 8) / "progress").read_text() == "up to 07:00"


def test_a_run_after_hours_without_a_run_goes_on_from_the_last_one(tmp_path: Path) -> None:
    _run(tmp_path, 7, "up to 07:00")
    assert (_run(tmp_path, 11) / "progress").read_text() == "up to 07:00"


def test_a_cleared_run_starts_again_from_its_predecessor_after_later_runs(tmp_path: Path) -> None:
    _run(tmp_path, 7, "up to 07:00")
    _run(tmp_path, 8, "up to 08:00")
    _run(tmp_path, 9, "up to 09:00")
    again = _run(tmp_path, 8)
    assert (again / "progress").read_text() == "up to 07:00", "not its own half-done copy, not the later run's"
    first_again = _run(tmp_path, 7)
    assert not (first_again / "progress").exists(), "the first run's predecessor is the seed"


def test_the_interval_end_must_be_an_aware_iso_time(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not an ISO time"):
        checkpoint_for(tmp_path, "yesterday")
    with pytest.raises(SystemExit, match="no time zone"):
        checkpoint_for(tmp_path, "2026-11-27T07:00:00")
