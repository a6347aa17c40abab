"""The deferred message sensor's function in tests/airflow_dags/deferred_message_probe.py (the triggerer imports it
by its dotted path: the deployment's components have the checkout on PYTHONPATH)."""

from __future__ import annotations

from typing import Any


def is_planted(message: Any) -> bool:
    """The message the test planted: a JSON body with an ``order`` of 4343."""
    return message.json().get("order") == 4343
