"""The batch ledger's value schemas (JSON Schemas, published as docs/schemas/ledger-record.schema.json and,
for the counts, ledger-counts.schema.json) and the check every value passes on read and on write.

The check is a small interpreter of the schema's own keywords (``type``, ``required``, ``enum``,
``minimum``, ``minLength``), so Spark executors and triggerers need no ``jsonschema`` package;
a test validates the same records with ``jsonschema`` against the published file. One deliberate
difference: an integer field written as ``3.0`` is refused here (JSON Schema accepts it); write
integers without a fraction, as every JSON encoder does for whole numbers.
"""

from __future__ import annotations

from typing import Any, cast

from airflow_jetstream.client.errors import LedgerRecordError

STATES = ("published", "in_progress", "consumed", "failed")
_TEXT = {"type": "string", "minLength": 1}
_TIME = {"type": "string", "format": "date-time"}
_OPTIONAL_TIME = {"type": ["string", "null"], "format": "date-time"}
_OPTIONAL_TEXT = {"type": ["string", "null"]}
_SEQ = {"type": ["integer", "null"], "minimum": 1}

#: JSON Schema (2020-12) of one ledger value. Fields other services add are allowed and kept.
LEDGER_RECORD_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://airflow-jetstream.dev/schemas/ledger-record.schema.json",
    "title": "airflow-jetstream batch ledger record",
    "description": "The JSON value of one batch in the batch ledger KV bucket (key <run>.<batch>, escaped). "
                   "Writers must keep fields they do not know; times are RFC 3339.",
    "type": "object",
    "required": ["run_id", "batch_id", "stream", "count", "state"],
    "properties": {
        "run_id": _TEXT,
        "batch_id": _TEXT,
        "stream": _TEXT,
        "count": {"type": "integer", "minimum": 0},
        "first_seq": _SEQ,
        "last_seq": _SEQ,
        "state": {"enum": list(STATES)},
        "attempts": {"type": "integer", "minimum": 0},
        "max_attempts": {"type": ["integer", "null"], "minimum": 1},
        "owner": _OPTIONAL_TEXT,
        "claim_id": _OPTIONAL_TEXT,
        "claimed_at": _OPTIONAL_TIME,
        "deadline": _OPTIONAL_TIME,
        "created_at": _TIME,
        "updated_at": _TIME,
        "consumed_at": _OPTIONAL_TIME,
        "failed_at": _OPTIONAL_TIME,
        "last_error": _OPTIONAL_TEXT,
        "meta": {"type": "object"},
    },
    "additionalProperties": True,
}

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "object": (dict,), "array": (list,),
    "boolean": (bool,), "null": (type(None),),
}


def _type_ok(value: Any, names: str | list[str]) -> bool:
    for name in [names] if isinstance(names, str) else names:
        if isinstance(value, bool) and name in ("integer", "number"):
            continue
        if isinstance(value, _JSON_TYPES[name]):
            return True
    return False


def schema_problem(schema: dict[str, Any], body: Any) -> str | None:
    """What makes ``body`` not match ``schema`` (naming the field), or None when it does."""
    if not isinstance(body, dict):
        return f"the value is a JSON {type(body).__name__}, not an object"
    for name in schema["required"]:
        if name not in body:
            return f"field {name!r} is missing"
    for name, rule in schema["properties"].items():
        if name not in body:
            continue
        value = body[name]
        if "type" in rule and not _type_ok(value, rule["type"]):
            return f"field {name!r} is {value!r}, not of type {rule['type']}"
        if "enum" in rule and value not in rule["enum"]:
            return f"field {name!r} is {value!r}, not one of {', '.join(rule['enum'])}"
        if "minimum" in rule and value is not None and value < rule["minimum"]:
            return f"field {name!r} is {value!r}, below {rule['minimum']}"
        if "minLength" in rule and len(value) < rule["minLength"]:
            return f"field {name!r} is empty"
    return None


def record_problem(body: Any) -> str | None:
    """What makes ``body`` not a ledger record (naming the field), or None when it is one."""
    return schema_problem(LEDGER_RECORD_SCHEMA, body)


def check_record(body: Any, *, key: str, when: str) -> dict[str, Any]:
    """``body`` when it is a valid ledger record, else :class:`LedgerRecordError` naming the key and field."""
    problem = record_problem(body)
    if problem:
        raise LedgerRecordError(
            f"ledger key {key!r}: {problem} ({when}); see docs/schemas/ledger-record.schema.json for the "
            "value schema, and fix the service that wrote it",
        )
    return cast(dict[str, Any], body)  # record_problem checked it is an object
