"""Which advisories a sensor or trigger waits for: :class:`AdvisoryFilter` and user predicates.

A filter is plain data (it travels inside a serialized trigger); a predicate is given by the dotted
path of a module-level function so that the triggerer can import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any, cast

from airflow_jetstream.client.advisories.types import (
    ADVISORY_PREFIX,
    EVENT_PREFIX,
    KINDS,
    Advisory,
    AdvisoryKind,
    get_kind,
)
from airflow_jetstream.client.errors import InvalidFunctionError, InvalidRequestError
from airflow_jetstream.client.reading.apply_function import function_path, load_function
from airflow_jetstream.client.subjects import subject_matches, validate_name, validate_subject


class AdvisoryPredicateError(InvalidFunctionError):
    """A user predicate given by dotted path cannot be imported, is not callable, or raised."""

    default_reason = "invalid_predicate"


# --------------------------------------------------------------------------------------- filters


@lru_cache(maxsize=128)
def load_predicate(path: str) -> Callable[[dict[str, Any]], bool]:
    """Import ``"package.module.function"`` (or ``"package.module:function"``) and return it."""
    try:
        return cast(Callable[[dict[str, Any]], bool], load_function(path, what="predicate"))
    except InvalidFunctionError as exc:
        raise AdvisoryPredicateError(exc.message) from None


def predicate_path(func: Callable[..., Any]) -> str:
    """The dotted path of a module-level function, checked to import back to the same object."""
    try:
        return function_path(func, what="predicate")
    except InvalidFunctionError as exc:
        raise AdvisoryPredicateError(exc.message) from None


@dataclass(frozen=True)
class AdvisoryFilter:
    """Which advisories match. Every field given must match; ``None`` means any.

    :param advisory: a kind (``"batch_abandoned"``), a subject (``"$JS.EVENT.ADVISORY.STREAM.>"``,
        wildcards allowed) or None for every advisory.
    :param stream, consumer, batch, reason: compared with the advisory's JSON fields.
    :param match: a dict of further JSON field values, or the dotted path of a predicate taking the
        advisory dict (:meth:`Advisory.to_dict`) and returning a bool.
    """

    advisory: str | None = None
    stream: str | None = None
    consumer: str | None = None
    batch: str | None = None
    reason: str | None = None
    match: dict[str, Any] | str | None = None

    def __post_init__(self) -> None:
        if self.advisory is not None:
            if not isinstance(self.advisory, str) or not self.advisory:
                raise InvalidRequestError(f"advisory must be a kind or a subject, got {self.advisory!r}",
                                          reason="unknown_advisory")
            if self.advisory.startswith(f"{EVENT_PREFIX}."):
                validate_subject(self.advisory, allow_wildcards=True, what="advisory subject")
            else:
                get_kind(self.advisory)
        if self.stream is not None:
            validate_name(self.stream, what="stream name")
        if self.consumer is not None:
            validate_name(self.consumer, what="consumer name")
        if isinstance(self.match, str):
            load_predicate(self.match)
        elif self.match is not None and not isinstance(self.match, dict):
            raise AdvisoryPredicateError(
                f"match must be a dict of field values or a predicate's dotted path, got {type(self.match).__name__}"
            )

    @property
    def kind(self) -> AdvisoryKind | None:
        if self.advisory and not self.advisory.startswith(f"{EVENT_PREFIX}."):
            return KINDS[self.advisory]
        return None

    def subject(self) -> str:
        """The narrowest subject covering every matching advisory (for a consumer filter or a subscription)."""
        kind = self.kind
        if kind is not None:
            stream = self.stream if kind.has_stream else None
            consumer = self.consumer if kind.has_consumer else None
            return kind.subject_for(stream, consumer)
        return self.advisory or f"{ADVISORY_PREFIX}.>"

    def matches(self, advisory: Advisory) -> bool:
        kind = self.kind
        if kind is not None and advisory.kind != kind.name:
            return False
        if kind is None and self.advisory and not (advisory.subject and subject_matches(self.advisory,
                                                                                        advisory.subject)):
            return False
        raw = advisory.raw
        for key in ("stream", "consumer", "batch", "reason"):
            wanted = getattr(self, key)
            if wanted is not None and raw.get(key) != wanted:
                return False
        if isinstance(self.match, dict):
            return all(raw.get(k) == v for k, v in self.match.items())
        if isinstance(self.match, str):
            return self._call_predicate(advisory)
        return True

    def _call_predicate(self, advisory: Advisory) -> bool:
        predicate = load_predicate(str(self.match))
        try:
            return bool(predicate(advisory.to_dict()))
        except Exception as exc:
            raise AdvisoryPredicateError(
                f"predicate {self.match!r} raised {type(exc).__name__}: {exc}", reason="predicate_failed"
            ) from exc

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdvisoryFilter:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})

    def describe(self) -> str:
        parts = [self.advisory or "any advisory"]
        parts += [f"{k}={v}" for k, v in self.to_dict().items() if k != "advisory" and v is not None]
        return " ".join(parts)
