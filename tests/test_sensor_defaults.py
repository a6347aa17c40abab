"""Every sensor's ``deferrable`` follows Airflow's ``[operators] default_deferrable``, as Airflow's own providers do.

The default is read when the sensor module is imported, so each setting gets a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

LIST_DEFAULTS = """
import importlib, inspect, json, pkgutil
import airflow_jetstream.sensors as pkg
from airflow.sdk import BaseSensorOperator

defaults = {}
for info in pkgutil.iter_modules(pkg.__path__):
    module = importlib.import_module(f"{pkg.__name__}.{info.name}")
    for name, cls in vars(module).items():
        if (inspect.isclass(cls) and issubclass(cls, BaseSensorOperator) and cls.__module__ == module.__name__
                and not name.startswith("_") and name != "JetStreamBaseSensor"):  # the base has no deferrable
            for klass in cls.__mro__:
                params = inspect.signature(klass.__init__).parameters
                if "deferrable" in params:
                    defaults[f"{module.__name__}.{name}"] = params["deferrable"].default
                    break
            else:
                defaults[f"{module.__name__}.{name}"] = "no deferrable parameter"
print(json.dumps(defaults))
"""


@pytest.mark.parametrize("setting", ["True", "False"])
def test_every_sensor_defaults_to_airflows_default_deferrable(setting: str) -> None:
    env = {**os.environ, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": setting}
    proc = subprocess.run([sys.executable, "-c", LIST_DEFAULTS], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    defaults = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"airflow_jetstream.sensors.advisory.JetStreamAdvisorySensor",
            "airflow_jetstream.sensors.consumer.JetStreamSourceCaughtUpSensor",
            "airflow_jetstream.sensors.ledger.JetStreamBatchLedgerSensor"} <= set(defaults)
    assert defaults == dict.fromkeys(defaults, setting == "True")
