"""One name per concept (docs/api.md): a renamed argument is refused with the name to use instead.

Nothing is translated (0.1.0 is the first release, there are no deprecated aliases): a class lists the
names it refuses in ``renamed_arguments`` (old name -> name to use), and :class:`RenamedArguments` raises
:class:`~airflow_jetstream.client.errors.RenamedArgumentError` when one is given, before ``__init__`` runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from airflow_jetstream.client.errors import RenamedArgumentError


def refuse_renamed(owner: str, given: Iterable[str], renamed: Mapping[str, str], *, what: str = "argument") -> None:
    """Raise :class:`RenamedArgumentError` naming the new names when ``given`` holds an old one."""
    old = sorted(name for name in given if name in renamed)
    if old:
        fixes = "; ".join(f"the {what} {name} is called {renamed[name]}" for name in old)
        raise RenamedArgumentError(f"{owner}: {fixes} (one name per concept, see docs/api.md)")


def renamed_arguments_of(cls: type) -> dict[str, str]:
    """Every rename ``cls`` refuses, its own and its bases'."""
    table: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        table.update(vars(klass).get("renamed_arguments", {}))
    return table


class RenamedArguments:
    """Mixin: refuse the keyword arguments named in ``renamed_arguments`` (of the class and its bases)."""

    renamed_arguments: ClassVar[Mapping[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = vars(cls).get("__init__")
        if init is not None and not getattr(init, "refuses_renamed", False):
            cls.__init__ = _checked(init)  # type: ignore[method-assign]


def _checked(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        refuse_renamed(type(self).__name__, kwargs, renamed_arguments_of(type(self)))
        init(self, *args, **kwargs)

    __init__.refuses_renamed = True  # type: ignore[attr-defined]
    return __init__
