"""Handing the ``nats`` connection to Spark jobs, without Spark running: conf keys, the properties
file, precedence of options, the one field parser, the shipped package and the operator's checks."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_jetstream.client.errors import InvalidRequestError, InvalidSettingsError
from airflow_jetstream.client.settings import SECRET_FIELDS, ConnectionSettings, settings_from_fields
from airflow_jetstream.get_provider_info import CONN_FIELDS
from airflow_jetstream.hooks.jetstream import settings_from_connection
from airflow_jetstream.operators.spark_submit import JetStreamSparkSubmitOperator, handed_properties, properties_text
from airflow_jetstream.spark.driver import (
    conf_key,
    fields_from_conf,
    settings_to_conf,
    with_connection_defaults,
)
from airflow_jetstream.spark.options import ReadOptions

#: Spark's default spark.redaction.regex.
SPARK_REDACTION = re.compile(r"(?i)secret|password|token|access[.]key")


class _Conn:
    conn_id, schema, port, login, password = "c", None, None, None, None

    def __init__(self, **kw):
        self.__dict__.update(kw)
        self.extra_dejson = kw.get("extra", {})


def test_conf_round_trip_and_secret_keys_match_sparks_redaction(tls_files) -> None:
    settings = ConnectionSettings(servers="n1:4222,tls://n2:4223", nkey_seed_secret="SUAEXAMPLE",
                                  tls_ca_file=str(tls_files.ca), tls_verify=False, domain="hub", request_timeout=7.5)
    conf = settings_to_conf(settings)
    assert conf["spark.jetstream.servers"] == "nats://n1:4222,tls://n2:4223"
    assert conf["spark.jetstream.secret.nkey_seed_secret"] == "SUAEXAMPLE"
    assert conf["spark.jetstream.tls_verify"] == "false"
    assert all(SPARK_REDACTION.search(conf_key(name)) for name in SECRET_FIELDS)
    assert not [k for k in conf if SPARK_REDACTION.search(k) and not k.startswith("spark.jetstream.secret.")]
    assert settings_from_fields(fields_from_conf(conf.items())) == settings
    with pytest.raises(InvalidSettingsError, match=r"spark\.jetstream\.pasword"):
        fields_from_conf([("spark.jetstream.pasword", "x")])
    with pytest.raises(InvalidSettingsError, match=r"spark\.jetstream\.secret\.password"):
        fields_from_conf([("spark.jetstream.password", "x")])  # a secret outside the redacted prefix


def test_properties_file_is_private_nameless_and_keeps_the_defaults(tmp_path) -> None:
    base = tmp_path / "spark-defaults.conf"
    base.write_text("spark.executor.memory 512m\n")
    settings = ConnectionSettings(servers="127.0.0.1:4222", user="airflow", password="p\\w\nline")
    text = properties_text(settings, base)
    with handed_properties(text, tmp_path) as (path, fds):
        assert path == f"/dev/fd/{fds[0]}" and list(tmp_path.iterdir()) == [base], "the file has no name"
        assert stat.S_IMODE(os.fstat(fds[0]).st_mode) == 0o600 and os.fstat(fds[0]).st_nlink == 0
        # spark-submit's launcher and its JVM each open the path: both read the whole file
        assert Path(path).read_text() == Path(path).read_text() == text
    lines = text.splitlines()
    assert lines[0] == "spark.executor.memory 512m"
    assert "spark.jetstream.secret.password=p\\\\w\\nline" in lines and "spark.jetstream.user=airflow" in lines


def test_options_win_and_credentials_are_replaced_as_a_whole() -> None:
    conf = {"servers": "nats://a:4222", "user": "u", "password": "p", "domain": "hub"}
    assert with_connection_defaults(conf, {"servers": "nats://b:4222"})["user"] == "u"
    merged = with_connection_defaults(conf, {"token": "t"})
    assert merged == {"servers": "nats://a:4222", "domain": "hub", "token": "t"}
    opts = ReadOptions.parse({**with_connection_defaults(conf, {}), "stream": "S"})
    assert opts.settings.user == "u" and opts.settings.domain == "hub"


@pytest.mark.parametrize(("word", "value"), [("on", True), ("OFF", False), ("yes", True), ("0", False)])
def test_one_boolean_rule_for_the_connection_and_the_data_source(word, value) -> None:
    hook = settings_from_connection(_Conn(host="h", extra={"tls_verify": word}))
    spark = ReadOptions.parse({"servers": "h", "stream": "S", "tls_verify": word}).settings
    assert hook.tls_verify is value and spark.tls_verify is value
    with pytest.raises(InvalidSettingsError, match="true or false"):
        settings_from_connection(_Conn(host="h", extra={"tls_verify": "maybe"}))
    with pytest.raises(InvalidSettingsError, match="true or false"):
        ReadOptions.parse({"servers": "h", "stream": "S", "tls_verify": "maybe"})


def test_connection_form_fields_come_from_the_field_table() -> None:
    assert CONN_FIELDS["token"]["schema"]["format"] == "password"
    assert CONN_FIELDS["nkey_seed_secret"]["schema"]["format"] == "password"
    assert CONN_FIELDS["tls_verify"]["schema"] == {"type": ["boolean", "null"], "default": True}
    assert CONN_FIELDS["connect_timeout"]["schema"]["type"] == ["number", "null"]


#: Builds the process's zip, then a forked child exits normally (running the atexit handlers it inherited).
FORK_THEN_EXIT = """
import os, sys
from airflow_jetstream.spark.package import process_zip
path = process_zip()
child = os.fork()
if child == 0:
    sys.exit(0)
os.waitpid(child, 0)
print(path, path.exists())
"""


def test_the_process_zip_is_removed_when_its_process_exits() -> None:
    """Each process that registers the data source builds the zip in a temporary directory; left behind, an
    Airflow worker's /tmp grew by one directory per task run."""
    out = subprocess.run([sys.executable, "-c", FORK_THEN_EXIT], capture_output=True, text=True, check=True,
                         timeout=120)
    path, kept_after_the_child = out.stdout.split()
    assert kept_after_the_child == "True", "a forked child's exit removed its parent's zip"
    assert not Path(path).parent.exists(), f"{Path(path).parent} is left behind"


def test_operator_templates_the_conn_id_and_refuses_jetstream_conf(monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_NATS_OTHER", json.dumps({"conn_type": "nats", "host": "127.0.0.1"}))
    assert "nats_conn_id" in JetStreamSparkSubmitOperator.template_fields
    op = JetStreamSparkSubmitOperator(task_id="t", application="app.py", nats_conn_id="nats_other",
                                      conf={"spark.jetstream.servers": "nats://elsewhere:4222"})
    with pytest.raises(InvalidRequestError, match=r"spark\.jetstream\.servers") as err:
        op.execute({})
    assert err.value.reason == "conf_conflict"
