"""The JSON encoding of data source rows, both ways (the contract is docs/contracts.md).

Writing: one JSON object per row (timestamps RFC 3339 UTC with ``Z``, decimals exact as strings, binary as
base64; NaN and infinities refused). Reading (``decode=json``): one strict UTF-8 JSON object per payload,
each value fitting its column exactly; ``json_mode=failfast`` fails on the first bad message naming it,
``permissive`` nulls its columns and keeps the raw payload in the corrupt record column, as Spark's own
JSON reader does.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from functools import partial
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from airflow_jetstream.client.durations import to_rfc3339
from airflow_jetstream.client.errors import InvalidRequestError

JSON_MODES = ("failfast", "permissive")
DEFAULT_CORRUPT_RECORD_COLUMN = "_corrupt_record"
_INT_RANGES: dict[type, int] = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}


class BadValue(ValueError):
    """A JSON value that does not fit its column (the message says why)."""


def _reject_constant(name: str) -> Any:
    raise BadValue(f"{name} is not JSON")


def parse_payload(payload: bytes) -> dict[str, Any]:
    """The JSON object in ``payload`` (strict UTF-8, no BOM, no NaN/Infinity), or :class:`BadValue`."""
    if not payload:
        raise BadValue("the payload is empty")
    try:
        text = bytes(payload).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadValue(f"the payload is not UTF-8 (byte {exc.start})") from None
    if text.startswith("\ufeff"):
        raise BadValue("the payload starts with a UTF-8 byte order mark")
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except BadValue:
        raise
    except ValueError as exc:
        raise BadValue(f"the payload is not JSON ({exc})") from None
    if not isinstance(value, dict):
        kind = {type(None): "null", list: "array", str: "string", bool: "boolean"}.get(type(value), "number")
        raise BadValue(f"the payload is a JSON {kind}, not an object")
    return value


def _timestamp(value: Any, *, ntz: bool = False) -> datetime:
    """An RFC 3339 timestamp: without an offset it is UTC, or (``ntz``) a local date-time that may not have one."""
    if not isinstance(value, str):
        raise BadValue(f"{value!r} is not an RFC 3339 timestamp string")
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise BadValue(f"{value!r} is not an RFC 3339 timestamp") from None
    if ntz and when.tzinfo is not None:
        raise BadValue(f"{value!r} has a UTC offset; a timestamp_ntz column holds local date-times")
    return when if when.tzinfo or ntz else when.replace(tzinfo=UTC)


def _date(value: Any) -> date:
    try:
        if isinstance(value, str) and len(value) == 10:
            return date.fromisoformat(value)
    except ValueError:
        pass
    raise BadValue(f"{value!r} is not a date (YYYY-MM-DD)")


def _decimal(data_type: DecimalType) -> Callable[[Any], Decimal]:
    quantum = Decimal(1).scaleb(-data_type.scale)
    limit = Decimal(10) ** (data_type.precision - data_type.scale)

    def convert(value: Any) -> Decimal:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise BadValue(f"{value!r} is not a decimal")
        try:
            number = Decimal(value) if not isinstance(value, float) else Decimal(repr(value))
            exact = number.quantize(quantum)
        except (InvalidOperation, ValueError):
            raise BadValue(f"{value!r} is not a decimal") from None
        if exact != number or abs(exact) >= limit:
            raise BadValue(f"{value!r} does not fit decimal({data_type.precision},{data_type.scale})")
        return exact

    return convert


def _integer(bits: int, name: str) -> Callable[[Any], int]:
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1

    def convert(value: Any) -> int:
        if type(value) is not int:
            raise BadValue(f"{value!r} is not an integer (a {name} column)")
        if not low <= value <= high:
            raise BadValue(f"{value} is out of range for a {name} column ({low}..{high})")
        return value

    return convert


def _typed(kind: type | tuple[type, ...], name: str) -> Callable[[Any], Any]:
    kinds = kind if isinstance(kind, tuple) else (kind,)

    def convert(value: Any) -> Any:
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise BadValue(f"{value!r} is not a {name}")
        return value

    return convert


def _binary(value: Any) -> bytes:
    if not isinstance(value, str):
        raise BadValue(f"{value!r} is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadValue(f"{value!r} is not base64 text") from None


def converter(data_type: DataType) -> Callable[[Any], Any]:
    """A function from a parsed JSON value to the Python value Arrow stores in ``data_type`` (None stays None)."""
    inner = _converter(data_type)
    return lambda value: None if value is None else inner(value)


_number = _typed((int, float), "number")
_object = _typed(dict, "JSON object")
#: The converters of the column types that need no parameter of the type.
_SCALARS: dict[type, Callable[[Any], Any]] = {
    DoubleType: lambda v: float(_number(v)), FloatType: lambda v: float(_number(v)),
    StringType: _typed(str, "string"), BooleanType: _typed(bool, "boolean"), TimestampType: _timestamp,
    TimestampNTZType: partial(_timestamp, ntz=True), DateType: _date, BinaryType: _binary,
}


def _converter(data_type: DataType) -> Callable[[Any], Any]:
    kind = type(data_type)
    if kind in _INT_RANGES:
        return _integer(_INT_RANGES[kind], data_type.simpleString())
    if kind in _SCALARS:
        return _SCALARS[kind]
    if isinstance(data_type, DecimalType):
        return _decimal(data_type)
    if isinstance(data_type, ArrayType):
        element = converter(data_type.elementType)
        return lambda v: [element(e) for e in _typed(list, "JSON array")(v)]
    if isinstance(data_type, MapType):
        key, value = converter(data_type.keyType), converter(data_type.valueType)
        return lambda v: [(key(k), value(x)) for k, x in _object(v).items()]
    if isinstance(data_type, StructType):
        fields = [(f.name, converter(f.dataType)) for f in data_type.fields]
        return lambda v: {name: conv(_object(v).get(name)) for name, conv in fields}
    raise InvalidRequestError(f"decode=json cannot fill a {data_type.simpleString()} column", reason="invalid_schema")


def headers_kind(data_type: DataType, column: str, reason: str) -> str:
    """A headers column's type: ``"joined"`` for map<string,string> (a repeated name's values joined by ``, ``),
    ``"all"`` for map<string,array<string>> (every value); neither reads nor writes any other (refused with
    ``reason``)."""
    if isinstance(data_type, MapType) and isinstance(data_type.keyType, StringType):
        if isinstance(data_type.valueType, StringType):
            return "joined"
        if isinstance(data_type.valueType, ArrayType) and isinstance(data_type.valueType.elementType, StringType):
            return "all"
    raise InvalidRequestError(f"column {column!r} must be map<string,string> (a repeated name's values joined by "
                              f"', ') or map<string,array<string>> (every value), not {data_type.simpleString()}",
                              reason=reason)


# --- writing ------------------------------------------------------------------------------------

def _encoder(arrow_type: Any) -> Callable[[Any], Any] | None:
    """A function from Arrow's Python value of ``arrow_type`` to its JSON form; None when it already is."""
    import pyarrow as pa

    t = pa.types
    if t.is_integer(arrow_type) or t.is_string(arrow_type) or t.is_large_string(arrow_type) \
            or t.is_boolean(arrow_type) or t.is_null(arrow_type):
        return None
    if t.is_floating(arrow_type):
        return _finite
    if t.is_timestamp(arrow_type):  # a timestamp_ntz value (naive) has no offset
        return lambda v: v.isoformat() if v.tzinfo is None else to_rfc3339(v)
    if t.is_date(arrow_type):
        return date.isoformat
    if t.is_decimal(arrow_type):
        return lambda v: format(v, "f")
    if t.is_binary(arrow_type) or t.is_large_binary(arrow_type) or t.is_fixed_size_binary(arrow_type):
        return lambda v: base64.b64encode(v).decode("ascii")
    if t.is_map(arrow_type):
        key, item = _encoder(arrow_type.key_type), _encoder(arrow_type.item_type)
        return lambda v: {str(_apply(key, k)): _apply(item, x) for k, x in v}
    if t.is_list(arrow_type) or t.is_large_list(arrow_type) or t.is_fixed_size_list(arrow_type):
        element = _encoder(arrow_type.value_type)
        return None if element is None else (lambda v: [_apply(element, e) for e in v])
    if t.is_struct(arrow_type):
        fields = [(arrow_type.field(i).name, _encoder(arrow_type.field(i).type)) for i in range(arrow_type.num_fields)]
        return lambda v: {name: _apply(enc, v[name]) for name, enc in fields}
    raise InvalidRequestError(f"a {arrow_type} column has no JSON row encoding (docs/contracts.md); cast it "
                              "(e.g. to string) or send a payload column", reason="invalid_column")


def _apply(encoder: Callable[[Any], Any] | None, value: Any) -> Any:
    return value if encoder is None or value is None else encoder(value)


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise BadValue(f"{value} has no JSON form (JSON has no NaN or infinity)")
    return value


def encode_rows(batch: Any, columns: list[str]) -> list[bytes]:
    """One JSON object per row of the Arrow record batch, with the given columns (see the module docs)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    selected = batch.select(columns)
    rows = selected.to_pylist()
    for name, arrow_type in zip(selected.schema.names, selected.schema.types, strict=True):
        try:
            if pa.types.is_floating(arrow_type):  # checked for the whole column at once: values stay as they are
                if pc.any(pc.invert(pc.is_finite(selected.column(name)))).as_py():
                    raise BadValue("NaN or infinity has no JSON form")
                continue
            encoder = _encoder(arrow_type)
            if encoder is None:
                continue
            for row in rows:
                if row[name] is not None:
                    row[name] = encoder(row[name])
        except BadValue as exc:
            raise InvalidRequestError(f"column {name!r}: {exc}; replace them first (e.g. "
                                      "df.na.replace(float('nan'), None))", reason="invalid_value") from None
    return [json.dumps(row, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode() for row in rows]
