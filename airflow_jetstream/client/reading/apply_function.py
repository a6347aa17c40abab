"""User functions given as a callable or a dotted path, as the Kafka provider takes them, and how
:func:`~airflow_jetstream.client.reading.consume.consume` reads and reacts to their failures (:class:`ConsumeOptions`),
all checked without a connection (operators check them when a DAG file is parsed).

``apply_function`` may be a callable or ``"package.module.function"``; ``apply_function_args`` and
``apply_function_kwargs`` are bound after the message (``func(message, *args, **kwargs)``). A
trigger must serialize its function, so there it is always the dotted path (:func:`function_path`).
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import InvalidFunctionError, InvalidRequestError

FunctionSpec = Callable[..., Any] | str


def load_function(spec: FunctionSpec, *, what: str = "apply_function") -> Callable[..., Any]:
    """The callable itself, or the one ``"package.module.function"`` (or ``"module:function"``) names."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidFunctionError(f"{what} must be a callable or a dotted path string, got {spec!r}")
    module_name, _, attr = spec.strip().replace(":", ".").rpartition(".")
    if not module_name:
        raise InvalidFunctionError(f"{what} {spec!r} is not a dotted path; use 'package.module.function'")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidFunctionError(f"{what} {spec!r}: cannot import module {module_name!r} ({exc}); "
                                   "install it where the task (or the triggerer) runs") from None
    for part in attr.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise InvalidFunctionError(f"{what} {spec!r} does not name a callable in module {module_name!r}")
    return cast(Callable[..., Any], target)


def function_path(spec: FunctionSpec, *, what: str = "apply_function") -> str:
    """The dotted path of ``spec`` (a path is checked to import), as a trigger must store it."""
    if isinstance(spec, str):
        load_function(spec, what=what)
        return spec.strip()
    path = f"{getattr(spec, '__module__', '')}.{getattr(spec, '__qualname__', '')}"
    try:
        same = "<" not in path and load_function(path, what=what) is spec
    except InvalidFunctionError:
        same = False
    if not same:
        raise InvalidFunctionError(
            f"{what} {spec!r} cannot be found again by a dotted path (a lambda, closure or function of the DAG "
            "file); deferrable mode needs a module-level function of an importable module, given as "
            "'package.module.function'"
        )
    return path


def bind_function(spec: FunctionSpec, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                  *, what: str = "apply_function") -> Callable[[Any], Any]:
    """``lambda message: func(message, *args, **kwargs)``; awaits the result of an async function."""
    func = load_function(spec, what=what)
    if args is not None and (isinstance(args, (str, bytes)) or not isinstance(args, Sequence)):
        raise InvalidFunctionError(f"{what}_args must be a list or tuple, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InvalidFunctionError(f"{what}_kwargs must be a dict, got {type(kwargs).__name__}")
    bound_args, bound_kwargs = tuple(args or ()), dict(kwargs or {})

    def call(message: Any) -> Any:
        return func(message, *bound_args, **bound_kwargs)

    call.__name__ = getattr(func, "__name__", what)
    return call


async def call_function(func: Callable[[Any], Any], message: Any) -> Any:
    """``func(message)``, awaited when ``func`` is a coroutine function."""
    result = func(message)
    if inspect.isawaitable(result):
        result = await result
    return result


def with_result(document: dict[str, Any], result: Any) -> dict[str, Any]:
    """``document`` plus a function's non-bool ``result`` (its ``repr`` when JSON cannot hold it), as an event or
    XCom shows what the function returned."""
    if isinstance(result, bool) or result is None:
        return document
    try:
        json.dumps(result)
    except (TypeError, ValueError):
        result = repr(result)
    return {**document, "result": result}


#: Seconds before a failed message is redelivered, by delivery count (the last one repeats).
DEFAULT_NAK_DELAY: tuple[float, ...] = (1.0, 5.0, 30.0, 60.0)
DEFAULT_ACK_WAIT = "5m"

Duration = float | int | str | timedelta


@dataclass
class ConsumeOptions:
    """How much to read and how to react to failures (validated on construction)."""

    per_batch: bool = False
    max_messages: int | None = None
    batch_size: int = 100
    fetch_timeout: Duration = 5.0
    nak_delay: Duration | Sequence[Duration] = DEFAULT_NAK_DELAY
    term_on: tuple[type[BaseException], ...] = ()
    nak_delays: tuple[float, ...] = field(init=False)
    fetch_timeout_seconds: float = field(init=False)

    def __post_init__(self) -> None:
        for name in ("max_messages", "batch_size"):
            value = getattr(self, name)
            if value is None and name == "max_messages":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequestError(f"{name} must be a whole number >= 1, got {value!r}", reason="invalid_option")
        self.fetch_timeout_seconds = to_seconds(self.fetch_timeout, field="fetch_timeout")
        if self.fetch_timeout_seconds <= 0:
            raise InvalidRequestError("fetch_timeout must be more than 0 seconds", reason="invalid_option")
        delays = self.nak_delay if isinstance(self.nak_delay, (list, tuple)) else [cast(Duration, self.nak_delay)]
        self.nak_delays = tuple(to_seconds(d, field="nak_delay") for d in delays) or (0.0,)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in self.term_on):
            raise InvalidRequestError(f"term_on must hold exception classes, got {self.term_on!r}",
                                      reason="invalid_option")

    def delay_for(self, delivered: int) -> float:
        """The nak delay of a message delivered ``delivered`` times."""
        return self.nak_delays[min(max(delivered, 1), len(self.nak_delays)) - 1]
