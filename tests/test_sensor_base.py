"""JetStreamBaseSensor.execute, deferrable, when the first poke already holds: its XCom value, also for a subclass
whose poke returns a plain bool (Airflow's own contract for poke), not an AttributeError on ``True.xcom_value``."""

from __future__ import annotations

from typing import Any

from airflow.sdk import PokeReturnValue

from airflow_jetstream.sensors.base import JetStreamBaseSensor


class _Holds(JetStreamBaseSensor):
    def __init__(self, *, answer: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.answer = answer
        self.deferrable = True
        self.nats_conn_id = "nats_default"

    def poke(self, context: Any) -> Any:
        return self.answer


def test_a_first_poke_that_holds_returns_its_xcom_value_without_deferring():
    assert _Holds(task_id="bool", answer=True).execute(context={}) is None
    assert _Holds(task_id="value", answer=PokeReturnValue(True, {"seq": 7})).execute(context={}) == {"seq": 7}
