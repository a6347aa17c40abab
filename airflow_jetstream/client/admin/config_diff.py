"""Which requested fields of a stream or consumer config differ from what the server has.

Shared by the idempotent create-or-update of streams and consumers, so both read "unchanged" the
same way. The server leaves zero values out of its JSON (Go ``omitempty``) and adds fields nobody
asked for, hence:

- a falsy requested value (``None``, ``False``, ``0``, ``""``, ``[]``, ``{}``) matches an absent or
  falsy current value;
- a dict matches when every requested key matches (keys only the server has are ignored);
- a list of scalars (``subjects``, ``filter_subjects``) matches as a multiset: order is not config;
- a list of dicts (``sources``) matches element by element, in order;
- a top-level field the server omitted is compared with its server default from ``defaults``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def config_value_matches(wanted: Any, current: Any) -> bool:
    """True when the server's ``current`` value already is the requested ``wanted`` value."""
    if _is_empty(wanted):
        return _is_empty(current)
    if isinstance(wanted, dict):
        return isinstance(current, dict) and all(config_value_matches(v, current.get(k)) for k, v in wanted.items())
    if isinstance(wanted, list):
        if not isinstance(current, list) or len(wanted) != len(current):
            return False
        if all(not isinstance(x, (dict, list)) for x in wanted):
            return sorted(map(str, wanted)) == sorted(map(str, current))
        return all(config_value_matches(w, c) for w, c in zip(wanted, current, strict=True))
    return bool(wanted == current)


def changed_fields(wanted: Mapping[str, Any], current: Mapping[str, Any], *,
                   defaults: Mapping[str, Any] | None = None,
                   same: Mapping[str, Callable[[Any, Any], bool]] | None = None) -> list[str]:
    """Sorted names of the requested fields whose value differs from the current config.

    ``same`` gives a field its own comparison (for example timestamps written in different forms);
    it is called only when the server has a value for the field.
    """
    defaults = defaults or {}
    same = same or {}
    changed = []
    for key, value in wanted.items():
        have = current.get(key, defaults.get(key))
        compare = same.get(key) if not _is_empty(have) else None
        if not (compare or config_value_matches)(value, have):
            changed.append(key)
    return sorted(changed)


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, (dict, list, str, int, float)) and not value)
