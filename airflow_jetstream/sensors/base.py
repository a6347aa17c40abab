"""What every JetStream sensor shares: SIGTERM and the timeout end the wait, in every mode."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import NoReturn

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException, AirflowTaskTerminated

#: Airflow's own deferral timeout comes this many seconds after the trigger's (which reports the last state).
TIMEOUT_BACKSTOP = 60


class JetStreamBaseSensor(BaseSensorOperator):
    """Base of the provider's sensors.

    Airflow's SIGTERM handler in the task's process only calls ``on_kill()`` and carries on; the
    default does nothing. Under ``airflow dags test`` a deferred sensor's trigger runs inline in that
    same process, so SIGTERM was ignored until SIGKILL. Raising here ends the poke, the reschedule
    wait or the inline trigger at once; the task fails as terminated.
    """

    def on_kill(self) -> None:
        raise AirflowTaskTerminated(f"task {self.task_id!r} received SIGTERM while waiting: stopped")

    def timed_out(self, what: str) -> NoReturn:
        """End a deferred wait whose trigger reported its deadline: skip with ``soft_fail``, else fail."""
        message = f"{what} within {self.timeout:.0f} s"
        if self.soft_fail:
            raise AirflowSkipException(message)
        raise AirflowSensorTimeout(message)


def deadline(timeout: float) -> str:
    """The ISO time ``timeout`` seconds from now: a trigger's ``timeout_at``."""
    return (datetime.now(UTC) + timedelta(seconds=timeout)).isoformat()
