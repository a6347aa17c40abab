"""The one comparison behind idempotent stream and consumer create-or-update."""

from __future__ import annotations

import pytest

from airflow_jetstream.client.admin.streams import changed_fields, config_value_matches


@pytest.mark.parametrize(("wanted", "current"), [
    (None, None), (False, None), (0, None), ("", None), ([], None), ({}, None),  # server omits zero values
    (False, 0), (None, ""),
    (["b", "a"], ["a", "b"]),  # subjects: order is not config
    ([1, 2], [2, 1]),
    ({"name": "S"}, {"name": "S", "opt_start_seq": 0, "added_by_server": True}),
    ([{"name": "A"}, {"name": "B"}], [{"name": "A", "x": 1}, {"name": "B"}]),
    ("limits", "limits"), (5, 5),
])
def test_values_that_match(wanted, current):
    assert config_value_matches(wanted, current)


@pytest.mark.parametrize(("wanted", "current"), [
    (True, None), (1, 0), ("x", ""), (["a"], None),
    (["a", "b"], ["a", "b", "c"]), (["a", "a"], ["a", "b"]),
    ({"name": "S"}, {"name": "T"}), ({"name": "S"}, "S"),
    ([{"name": "A"}, {"name": "B"}], [{"name": "B"}, {"name": "A"}]),  # sources: in order
    (5, "5"),
])
def test_values_that_differ(wanted, current):
    assert not config_value_matches(wanted, current)


def test_changed_fields_uses_defaults_for_omitted_fields():
    current = {"name": "S", "subjects": ["a.>"]}
    wanted = {"name": "S", "subjects": ["a.>"], "retention": "limits", "storage": "file", "discard": "new"}
    defaults = {"retention": "limits", "storage": "file", "discard": "old"}
    assert changed_fields(wanted, current, defaults=defaults) == ["discard"]
    assert changed_fields(wanted, current) == ["discard", "retention", "storage"]


def test_changed_fields_own_comparison_only_when_the_server_has_a_value():
    same = {"t": lambda a, b: a.lower() == b.lower()}
    assert changed_fields({"t": "ABC"}, {"t": "abc"}, same=same) == []
    assert changed_fields({"t": "ABC"}, {"t": "abd"}, same=same) == ["t"]
    assert changed_fields({"t": "ABC"}, {}, same=same) == ["t"]
    assert changed_fields({"t": None}, {}, same=same) == []
