"""``make up`` finds its DAGs and home in the checkout it runs in, not under site-packages, and keeps its ports
from one run to the next (tests/test_airflow_deployment.py starts it twice)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_jetstream.embedded.server import free_port
from tests.infra.airflow_local import UP_PORTS, LocalAirflow, up_folders, up_port
from tests.support.polling import wait_until

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


@pytest.fixture
def held_port() -> Iterator[tuple[int, socket.socket]]:
    """A port on 127.0.0.1 something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1], sock


def test_a_port_is_kept_across_runs_and_a_taken_one_is_replaced_for_one_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first_choice = free_port()
    monkeypatch.setitem(UP_PORTS, "nats-server", ("UP_NATS_PORT", first_choice, "nats-server"))
    monkeypatch.delenv("UP_NATS_PORT", raising=False)
    assert up_port(tmp_path, "nats-server") == (first_choice, None)
    assert json.loads((tmp_path / "ports.json").read_text()) == {"nats-server": first_choice}
    assert up_port(tmp_path, "nats-server") == (first_choice, None)

    with socket.socket() as sock:  # someone else took it meanwhile
        sock.bind(("127.0.0.1", first_choice))
        sock.listen()
        port, line = up_port(tmp_path, "nats-server")
    assert port != first_choice
    assert f"port {first_choice} of nats-server (the last run's) is taken: using {port} for this run only" in line
    assert "a second identity" in line, "it says what the stand-in port does to asset URIs"
    assert json.loads((tmp_path / "ports.json").read_text()) == {"nats-server": first_choice}
    assert up_port(tmp_path, "nats-server") == (first_choice, None), "back once it is free"


def test_a_taken_first_choice_is_replaced_for_good(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    held_port: tuple[int, socket.socket]) -> None:
    monkeypatch.setitem(UP_PORTS, "api-server", ("UP_PORT", held_port[0], "the Airflow UI"))
    monkeypatch.delenv("UP_PORT", raising=False)
    port, line = up_port(tmp_path, "api-server")
    assert line == f"port {held_port[0]} for the Airflow UI is taken: using {port} (kept for the next runs)"
    assert up_port(tmp_path, "api-server") == (port, None)


def test_a_chosen_port_is_kept_and_a_taken_one_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        held_port: tuple[int, socket.socket]) -> None:
    chosen = free_port()
    monkeypatch.setenv("UP_PORT", str(chosen))
    assert up_port(tmp_path, "api-server") == (chosen, None)
    monkeypatch.delenv("UP_PORT")
    assert up_port(tmp_path, "api-server") == (chosen, None)
    monkeypatch.setenv("UP_PORT", str(held_port[0]))
    with pytest.raises(SystemExit, match=f"UP_PORT={held_port[0]}: that port is taken"):
        up_port(tmp_path, "api-server")
    monkeypatch.setenv("UP_PORT", "eighty")
    with pytest.raises(SystemExit, match="UP_PORT='eighty': a port is a number"):
        up_port(tmp_path, "api-server")


#: A component that takes a moment to stop (the triggerer closes its triggers) and writes down every SIGTERM and
#: its exit into one shared file: ``<key> TERM`` / ``<key> exit``.
SLOW_STOPPER = """
import signal, sys, time
log, key, terms = sys.argv[1], sys.argv[2], []
def note(what):
    with open(log, "a") as out:
        out.write(f"{key} {what}\\n")
signal.signal(signal.SIGTERM, lambda *_: terms.append(time.monotonic()) or note("TERM"))
note("ready")
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not (terms and time.monotonic() - terms[0] > 1):
    time.sleep(0.05)
note("exit")
sys.exit(0 if terms else 3)
"""


def test_close_sends_each_component_one_sigterm_and_stops_the_api_server_last(tmp_path: Path) -> None:
    """A second SIGTERM makes Airflow's triggerer kill its trigger runner ("Forcing exit due to second exit
    signal"): `make up`'s Ctrl-C sends one to each component and waits for them to exit on their own; the
    api-server last, since the scheduler's running tasks call its Execution API until they finish."""
    airflow = LocalAirflow(tmp_path / "home", nats_url="nats://127.0.0.1:4222", dags_folder=tmp_path)
    log = tmp_path / "signals.log"
    for key in ("api-server", "scheduler", "triggerer"):
        airflow.processes[key] = subprocess.Popen([sys.executable, "-c", SLOW_STOPPER, str(log), key],
                                                  start_new_session=True)
        airflow._component_of[key] = key
        wait_until(lambda key=key: log.exists() and f"{key} ready" in log.read_text(), f"{key} to set its handler",
                   timeout=30, every=0.05)
    procs = dict(airflow.processes)
    airflow.close()
    assert {key: proc.returncode for key, proc in procs.items()} == dict.fromkeys(procs, 0)
    lines = log.read_text().splitlines()
    assert {key: lines.count(f"{key} TERM") for key in procs} == dict.fromkeys(procs, 1)
    assert lines.index("api-server TERM") > max(lines.index("scheduler exit"), lines.index("triggerer exit"))
