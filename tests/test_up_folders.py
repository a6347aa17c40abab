"""``make up`` finds its DAGs and home in the checkout it runs in, not under site-packages."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.infra.airflow_local import up_folders

REPO = Path(__file__).resolve().parents[1]


def test_the_current_checkout_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dags_examples").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("UP_HOME", raising=False)
    monkeypatch.delenv("UP_DAGS_FOLDER", raising=False)
    assert up_folders() == (tmp_path / ".up", tmp_path / "dags_examples")


def test_elsewhere_the_package_checkout_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("UP_HOME", raising=False)
    monkeypatch.delenv("UP_DAGS_FOLDER", raising=False)
    assert up_folders() == (REPO / ".up", REPO / "dags_examples")


def test_a_missing_dags_folder_says_what_to_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UP_DAGS_FOLDER", str(tmp_path / "nowhere"))
    monkeypatch.setenv("UP_HOME", str(tmp_path / "home"))
    with pytest.raises(SystemExit, match="set UP_DAGS_FOLDER"):
        up_folders()
    (tmp_path / "mine").mkdir()
    monkeypatch.setenv("UP_DAGS_FOLDER", str(tmp_path / "mine"))
    assert up_folders() == (tmp_path / "home", tmp_path / "mine")
