"""Each parameter table in docs/operators and docs/sensors says truly which parameters are templated: a "yes" names
a field of the class's ``template_fields`` (what Airflow renders), a "no" one it does not render."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
#: page -> the classes its parameter table describes.
PAGES = {
    "operators/consume.md": ["operators.consume.JetStreamConsumeOperator"],
    "operators/consumer.md": ["operators.consumer.JetStreamConsumerResetOperator"],
    "operators/kv.md": ["operators.kv.JetStreamKeyValueOperator"],
    "operators/publish.md": ["operators.publish.JetStreamAtomicBatchPublishOperator"],
    "operators/sourcing.md": ["operators.sourcing.JetStreamDurableSourceOperator"],
    "operators/stream.md": ["operators.stream.JetStreamEnsureStreamOperator"],
    "sensors/consumer.md": ["sensors.consumer.JetStreamSourceCaughtUpSensor",
                            "sensors.consumer.JetStreamConsumerDrainedSensor"],
    "sensors/kv.md": ["sensors.kv.JetStreamKeyValueSensor"],
    "sensors/message.md": ["sensors.message.JetStreamMessageSensor"],
}
_ROW = re.compile(r"^\| ([^|]+) \| (yes|no) \|", re.MULTILINE)


def templated(classes: list[str]) -> set[str]:
    fields: set[str] = set()
    for dotted in classes:
        module, name = dotted.rsplit(".", 1)
        fields |= set(getattr(importlib.import_module(f"airflow_jetstream.{module}"), name).template_fields)
    return fields


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_templated_column_says_what_airflow_renders(page: str) -> None:
    fields = templated(PAGES[page])
    rows = _ROW.findall((DOCS / page).read_text())
    assert rows, f"{page} has no parameter table with a templated column"
    wrong = [(name, said) for cell, said in rows for name in re.findall(r"`(\w+)`", cell)
             if (said == "yes") != (name in fields)]
    assert not wrong, f"{page}: the templated column is wrong for {wrong} (template_fields: {sorted(fields)})"
