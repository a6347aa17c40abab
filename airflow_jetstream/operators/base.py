"""Shared base of the JetStream operators and sensors: connection id handling (templated) and the hook."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.hooks.jetstream import JetStreamHook


def templated_int(value: Any, name: str, *, reason: str = "invalid_option") -> int | None:
    """A whole-number argument that may arrive as a rendered template (``"5"``); None when unset."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name} must be a whole number, got {value!r}", reason=reason)
    return value


def subject_list(subjects: Sequence[str] | str | None) -> list[str]:
    """Subjects given as a list or as one (rendered) comma-separated string."""
    if isinstance(subjects, str):
        return [s.strip() for s in subjects.split(",") if s.strip()]
    return list(subjects or ())


class JetStreamConnected:
    """What the provider's operators and sensors share: ``nats_conn_id``, a template field of every subclass
    (``"{{ var.value.nats_conn }}"`` works), and the :class:`JetStreamHook`, built lazily."""

    ui_color = "#27aae1"
    template_fields: Collection[str]
    nats_conn_id: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "nats_conn_id" not in cls.template_fields:
            cls.template_fields = (*cls.template_fields, "nats_conn_id")

    @cached_property
    def hook(self) -> JetStreamHook:
        return JetStreamHook(nats_conn_id=self.nats_conn_id)


class JetStreamBaseOperator(JetStreamConnected, BaseOperator):
    """Base class of the operators: holds ``nats_conn_id`` and builds the hook lazily (:class:`JetStreamConnected`)."""

    def __init__(self, *, nats_conn_id: str = JetStreamHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nats_conn_id = nats_conn_id
