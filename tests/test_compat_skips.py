"""The compatibility matrix's skip rule (tests/conftest.py, COMPAT_SKIP_SERVER_TOO_OLD): only a failure that
*is* the refusal of a feature the server lacks becomes a skip; any other failure stays a failure, also one
after a refusal the test expected and caught."""

from __future__ import annotations

import pytest

import tests.conftest as conftest

pytest_plugins = ["pytester"]

INNER = '''
import pytest

from airflow_jetstream.client import server_features
from airflow_jetstream.client.errors import ServerFeatureError


class OldServer:  # what server_features reads of a connection: the version in the server's INFO
    class nc:
        class connected_server_version:
            major, minor, patch = 2, 11, 0


def test_a_caught_refusal_then_an_unrelated_failure():
    with pytest.raises(ServerFeatureError):
        server_features.require(OldServer, server_features.FAST_BATCH)
    assert "stored" == "lost"


def test_the_refusal_itself():
    server_features.require(OldServer, server_features.FAST_BATCH)


def test_the_refusal_carried_as_text():
    try:
        server_features.require(OldServer, server_features.CONSUMER_RESET)
    except ServerFeatureError as exc:
        message = exc.message
    raise AssertionError(f"the trigger's error event: {message}")


def test_a_failure_without_any_refusal():
    assert 1 == 2
'''


def test_only_the_refusal_of_the_feature_under_test_is_a_skip(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "COMPAT_SKIPS", True)
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_inprocess("-p", "tests.conftest", "-p", "no:cacheprovider", "-q", "-rsf")
    result.assert_outcomes(failed=2, skipped=2)
    outcomes = "\n".join(result.outlines)
    assert "FAILED test_inner.py::test_a_caught_refusal_then_an_unrelated_failure" in outcomes
    assert "FAILED test_inner.py::test_a_failure_without_any_refusal" in outcomes
    assert "fast batch publish (stream allow_batched) needs nats-server 2.14.0" in outcomes
    assert "consumer reset needs nats-server 2.14.0" in outcomes
