"""What is checked without a connection, so operators and sensors check it when a DAG file is parsed: bucket
names and keys as nats accepts them, the stream behind a bucket, and what a key must hold for a wait to end."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from airflow_jetstream.client.errors import InvalidKeyError, InvalidRequestError
from airflow_jetstream.client.reading.apply_function import FunctionSpec, bind_function, call_function

_BUCKET = re.compile(r"^[a-zA-Z0-9_-]+$")
_KEY = re.compile(r"^[-/_=.a-zA-Z0-9]+$")


def check_bucket(bucket: Any) -> str:
    if not isinstance(bucket, str) or not _BUCKET.match(bucket):
        raise InvalidKeyError(f"KV bucket name {bucket!r} is not valid; use letters, digits, '_' and '-' only",
                              reason="invalid_bucket")
    return bucket


def stream_of(bucket: str) -> str:
    """The stream behind a bucket: ``KV_<bucket>``."""
    return f"KV_{check_bucket(bucket)}"


def validate_key(key: Any) -> str:
    """``key`` if nats accepts it as a KV key, else :class:`InvalidKeyError`."""
    if not isinstance(key, str) or not _KEY.match(key) or key.startswith(".") or key.endswith("."):
        raise InvalidKeyError(f"KV key {key!r} is not valid: use letters, digits and '-/_=.' (not first or last "
                              "'.'), no spaces or wildcards")
    return key


@dataclass(frozen=True)
class KeyCondition:
    """What the key must hold: with ``apply_function``, whatever makes ``apply_function(entry)`` truthy
    (``entry`` is the JSON-able dict of the value); else with ``value``, that value (a str compared with
    the text, anything else with the parsed JSON); else merely that the key exists."""

    value: Any = None
    apply_function: FunctionSpec | None = None
    apply_function_args: Sequence[Any] = ()
    apply_function_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.apply_function is not None and self.value is not None:
            raise InvalidRequestError("give value or apply_function, not both (compare with the value inside the "
                                      "function if both matter)", reason="invalid_option")
        if self.apply_function is not None:  # fail early on a bad function
            bind_function(self.apply_function, self.apply_function_args, self.apply_function_kwargs)

    @property
    def expect(self) -> str:
        return "function" if self.apply_function is not None else "equals" if self.value is not None else "exists"

    def describe(self) -> str:
        if self.expect == "function":
            name = self.apply_function if isinstance(self.apply_function, str) else \
                getattr(self.apply_function, "__name__", "apply_function")
            return f"satisfies {name}"
        return f"equals {self.value!r}" if self.expect == "equals" else "exists"

    async def holds(self, entry: dict[str, Any]) -> Any:
        """Truthy when ``entry`` satisfies the condition (the function's own result in function mode)."""
        if self.expect == "function":
            func = bind_function(cast(FunctionSpec, self.apply_function), self.apply_function_args,
                                 self.apply_function_kwargs)
            return await call_function(func, entry)
        if self.expect == "equals":
            if isinstance(self.value, (bytes, bytearray)):
                return entry["encoding"] == "utf-8" and entry["value"].encode() == bytes(self.value)
            if isinstance(self.value, str):
                return entry["encoding"] == "utf-8" and entry["value"] == self.value
            return "json" in entry and entry["json"] == self.value
        return True
