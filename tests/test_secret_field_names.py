"""The ``nats`` connection's secret fields carry names Airflow masks without configuration (and Spark's UI too).

Airflow hides a connection extra by its key name only (``[core] sensitive_var_conn_names`` added to its
defaults: password, secret, token, ...): in ``/api/v2/connections``, the edit form and logs. The NKey seed
is ``nkey_seed_secret`` for that reason; a key the connection does not know is refused naming the ones it knows
(tests/test_airflow_first_contact.py checks a real api-server and the CLI).
"""

from __future__ import annotations

import json
import re

import pytest

from airflow_jetstream.client.errors import InvalidSettingsError
from airflow_jetstream.client.settings import CONNECTION_FIELDS, SECRET_FIELDS, ConnectionSettings, settings_from_fields
from airflow_jetstream.get_provider_info import CONN_FIELDS
from airflow_jetstream.hooks.jetstream import JetStreamHook

#: Spark's default ``spark.redaction.regex`` (Spark UI, event log, ``--verbose``).
SPARK_REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key"
SECRETS = [name for name, spec in CONNECTION_FIELDS.items() if spec.secret]


def test_the_secret_fields_are_the_ones_the_settings_hide() -> None:
    assert set(SECRETS) | {"password"} == set(SECRET_FIELDS)
    assert all(CONN_FIELDS[name]["schema"].get("format") == "password" for name in SECRETS)


@pytest.mark.parametrize("name", SECRETS)
def test_airflow_masks_each_secret_field_by_its_name(name: str) -> None:
    from airflow._shared.secrets_masker import redact, should_hide_value_for_key

    assert should_hide_value_for_key(name), f"Airflow shows {name!r} in its connections API and form"
    assert redact({name: "SUAVALUE1234", "client_name": "etl"}) == {name: "***", "client_name": "etl"}


@pytest.mark.parametrize("name", SECRETS)
def test_spark_redacts_each_secret_field_by_its_name(name: str) -> None:
    assert re.search(SPARK_REDACTION_REGEX, name)


def test_an_unknown_field_is_refused_naming_the_known_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidSettingsError, match=r"unknown jetstream option.*nkey_seed; known: .*nkey_seed_secret"):
        settings_from_fields({"servers": "h", "nkey_seed": "SUAVALUE"}, what="jetstream option")
    monkeypatch.setenv("AIRFLOW_CONN_NATS_OLD_SEED", json.dumps(
        {"conn_type": "nats", "host": "h", "extra": {"nkey_seed": "SUAOLDSEEDVALUE"}}))
    with pytest.raises(InvalidSettingsError) as raised:
        JetStreamHook("nats_old_seed").get_settings()
    message = str(raised.value)
    assert "connection 'nats_old_seed'" in message and "nkey_seed_secret" in message
    assert "SUAOLDSEEDVALUE" not in message


def test_the_new_name_reaches_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_NATS_SEED", json.dumps(
        {"conn_type": "nats", "host": "h", "extra": {"nkey_seed_secret": "SUANEWSEEDVALUE"}}))
    settings = JetStreamHook("nats_seed").get_settings()
    assert settings == ConnectionSettings(servers="h", nkey_seed_secret="SUANEWSEEDVALUE")
    assert settings.connect_options()["nkeys_seed_str"] == "SUANEWSEEDVALUE"
    assert "SUANEWSEEDVALUE" not in repr(settings)


def test_no_page_puts_a_secret_on_an_airflow_command_line() -> None:
    """Airflow's audit log keeps each CLI command with only its password flags masked: a secret field in
    ``--conn-extra``, ``--conn-json``'s extra or ``--conn-uri``'s query would be there in clear (docs/connection.md;
    tests/test_airflow_first_contact.py shows it in a real audit log)."""
    from tests.test_install_commands import _FENCE, doc_pages

    secret = re.compile(r"(?:--conn-extra|--conn-json|--conn-uri)\b.*\b(?:" + "|".join(SECRETS) + r")\b", re.S)
    found = []
    for page in doc_pages():
        for block in _FENCE.findall(page.read_text(encoding="utf-8")):
            for command in re.split(r"\n(?![ \t])", block.replace("\\\n", " ")):
                if "airflow connections" in command and secret.search(command):
                    found.append(f"{page.name}: {command.strip()}")
    assert not found, f"secrets on an airflow command line, kept in clear in its audit log: {found}"
