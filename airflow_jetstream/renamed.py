"""Old argument names that keep working for one release, with a DeprecationWarning.

The provider uses one name per concept (see the vocabulary table in docs/api.md). Classes whose
arguments were renamed call :func:`take_renamed` on their ``**kwargs`` before anything else, so DAGs
and serialized trigger kwargs written with the old names still load.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from typing import Any

#: The release that drops the old names.
REMOVED_IN = "2.0"


def take_renamed(owner: str, kwargs: dict[str, Any], renames: Mapping[str, str],
                 given: Mapping[str, Any]) -> dict[str, Any]:
    """Pop old names out of ``kwargs``; return ``{new name: value}`` for each one that was passed.

    ``given`` holds the new names' values as passed (None when not passed): passing both the old and
    the new name is a ``TypeError``. Each old name warns (``DeprecationWarning``) at the DAG's line.
    """
    found: dict[str, Any] = {}
    for old, new in renames.items():
        if old not in kwargs:
            continue
        value = kwargs.pop(old)
        if given.get(new) is not None:
            raise TypeError(f"{owner}: give {new}= only; {old}= is its deprecated name")
        deprecated(f"{owner}: {old}= is deprecated and will be removed in {REMOVED_IN}; use {new}=")
        found[new] = value
    return found


def deprecated(message: str) -> None:
    """Warn (``DeprecationWarning``) at the first caller outside Airflow and this provider: the DAG file."""
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and frame.f_globals.get("__name__", "").split(".")[0] in (
            "airflow", "airflow_jetstream"):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, DeprecationWarning, stacklevel=level)
