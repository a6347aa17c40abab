"""JetStreamSparkSubmitOperator: spark-submit with the ``nats`` connection handed to the job.

Needs the ``spark`` extra (the Spark provider): without it, importing this module raises Airflow's
``AirflowOptionalProviderFeatureException`` naming the extra, so a DAG file using the operator fails to
parse with that message while the rest of the provider works. A DAG file that imports this module pays
for Airflow's ``SparkSubmitOperator`` only: the Spark side of the provider (``airflow_jetstream.spark``,
which imports pyspark) is imported when the task runs.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow.providers.common.compat.sdk import AirflowOptionalProviderFeatureException
from airflow.sdk.exceptions import AirflowException

try:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
except ModuleNotFoundError as missing:
    if not (missing.name or "").startswith("airflow.providers.apache"):
        raise
    raise AirflowOptionalProviderFeatureException(
        "JetStreamSparkSubmitOperator needs the Spark provider (apache-airflow-providers-apache-spark), which "
        'comes with the spark extra: pip install "airflow-jetstream[spark]"') from missing

from airflow_jetstream.client.errors import InvalidRequestError
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.ui.links import JetStreamLedgerRunLink, JetStreamViewLink

PROPERTIES_NAME = "jetstream-spark.properties"
#: The file the job's driver records the cause of its failure in (airflow_jetstream/spark/failure.py).
FAILURE_NAME = "failure.txt"


#: Names of variables that hold or may hold a secret, besides Airflow's connections, variables and sensitive
#: configuration: the words Airflow's masker and Spark's ``spark.redaction.regex`` hide.
_SECRET_WORDS = re.compile(r"(?i)secret|passw(or)?d|token|api_?key|private_?key|passphrase|access_?key|credential")


def secret_variables(environ: Mapping[str, str]) -> list[str]:
    """The variables of ``environ`` a Spark process must not inherit: ``AIRFLOW_CONN_*``, ``AIRFLOW_VAR_*``, Airflow's
    sensitive configuration (``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``, ``AIRFLOW__CORE__FERNET_KEY``, ... and their
    ``_CMD``/``_SECRET`` forms) and any name with a secret word in it."""
    from airflow.configuration import conf

    sensitive = {f"AIRFLOW__{section}__{key}".upper() for section, key in conf.sensitive_config_values}
    return sorted(name for name in environ
                  if name.startswith(("AIRFLOW_CONN_", "AIRFLOW_VAR_")) or _SECRET_WORDS.search(name)
                  or re.sub(r"_(CMD|SECRET)$", "", name) in sensitive)


def _escape(text: str) -> str:
    """A value as java.util.Properties reads it back (Spark trims values, so no outer white space)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def default_properties_file() -> Path | None:
    """spark-defaults.conf as spark-submit would load it (``--properties-file`` replaces that file)."""
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None
    )
    path = Path(conf_dir, "spark-defaults.conf") if conf_dir else None
    return path if path and path.is_file() else None


def write_properties_file(path: str | Path, settings: ConnectionSettings, base: str | Path | None = None,
                          job_conf: Mapping[str, str] | None = None) -> Path:
    """Write ``base`` (a properties file, or spark-defaults.conf) plus the connection's ``spark.jetstream.*``
    entries (and ``job_conf``, the operator's ``spark.jetstream.job.*`` keys) to a new file readable by its
    owner only; return its path."""
    from airflow_jetstream.spark.connection import settings_to_conf

    path = Path(path)
    base = Path(base) if base else default_properties_file()
    lines = [base.read_text(encoding="utf-8").rstrip("\n")] if base else []
    entries = {**settings_to_conf(settings), **(job_conf or {})}
    lines += [f"{key}={_escape(value)}" for key, value in sorted(entries.items())]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


class JetStreamSparkSubmitOperator(SparkSubmitOperator):
    """A ``SparkSubmitOperator`` whose job reaches NATS with the ``nats_conn_id`` connection.

    The connection's servers and auth (user/password, token, nkey seed, creds file, TLS files,
    domain) reach the job as ``spark.jetstream.*`` Spark conf in a private (0600) properties file
    given to spark-submit with ``--properties-file`` and deleted after the run: never on the command
    line. Secrets sit under ``spark.jetstream.secret.*``, which Spark redacts in its UI and event
    log. The application calls :func:`airflow_jetstream.spark.register` and then uses
    ``format("jetstream")`` without ``servers`` or credentials; explicit options still win::

        JetStreamSparkSubmitOperator(task_id="produce", application="produce.py",
                                     nats_conn_id="nats_default", ship_package=True)

    :param nats_conn_id: the ``nats`` connection handed to the job (templated).
    :param ship_package: add a zip of ``airflow_jetstream`` (client + spark) and nats-py to
        ``py_files``, for executors that do not have the package installed.
    :param stream: the stream the job reads or writes, for the task's "JetStream" extra link (it opens the
        view at that stream's row); not passed to the job (templated).
    Every other argument is ``SparkSubmitOperator``'s. A ``properties_file`` given is merged into the
    generated file; without one, spark-defaults.conf (``SPARK_CONF_DIR`` or ``SPARK_HOME/conf``) is.

    spark-submit, and so the driver and its Python workers, does not inherit the task's secret variables
    (:func:`secret_variables`: ``AIRFLOW_CONN_*`` and the like): they are set empty in its ``env_vars`` (the Spark
    provider starts spark-submit with the task's environment and ``env_vars`` on top). ``env_vars`` you give win.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "nats_conn_id", "stream")
    operator_extra_links = (*SparkSubmitOperator.operator_extra_links, JetStreamViewLink(), JetStreamLedgerRunLink())

    def __init__(self, *, nats_conn_id: str = JetStreamHook.default_conn_name, ship_package: bool = False,
                 stream: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nats_conn_id = nats_conn_id
        self.ship_package = ship_package
        self.stream = stream

    def execute(self, context: Mapping[str, Any]) -> None:
        from airflow_jetstream.spark.failure import FAILURE_FILE_CONF
        from airflow_jetstream.spark.package import PACKAGE_ZIP, build_py_files
        from airflow_jetstream.spark.versions import check_pyspark_install

        check_pyspark_install()  # spark-submit comes from the installed pyspark
        settings = JetStreamHook(nats_conn_id=self.nats_conn_id).get_settings()  # registers secrets for masking
        self._refuse_conf_overrides()
        given_properties, given_py_files, given_env = self.properties_file, self.py_files, self.env_vars
        blanked = dict.fromkeys(secret_variables(os.environ), "")
        self.env_vars = {**blanked, **(given_env or {})} if blanked else given_env
        with tempfile.TemporaryDirectory(prefix="jetstream-spark-") as tmp:
            failure = Path(tmp, FAILURE_NAME)
            self.properties_file = str(write_properties_file(Path(tmp, PROPERTIES_NAME), settings, given_properties,
                                                             {FAILURE_FILE_CONF: str(failure)}))
            if self.ship_package:
                shipped = str(build_py_files(Path(tmp, PACKAGE_ZIP)))
                self.py_files = f"{given_py_files},{shipped}" if given_py_files else shipped
            self.log.info("nats connection %r handed to the Spark job: %d server(s), auth %s, via --properties-file%s",
                          self.nats_conn_id, len(settings.servers), _auth_kind(settings),
                          " (package shipped with --py-files)" if self.ship_package else "")
            try:
                super().execute(context)  # type: ignore[arg-type]
            except AirflowException as exc:
                cause = _failure_cause(failure, exc)
                if cause is None:
                    raise
                raise AirflowException(f"the Spark job failed: {cause}") from exc
            finally:
                self.properties_file, self.py_files, self.env_vars = given_properties, given_py_files, given_env

    def _refuse_conf_overrides(self) -> None:
        from airflow_jetstream.spark.connection import CONF_PREFIX

        clashing = sorted(k for k in (self.conf or {}) if str(k).startswith(CONF_PREFIX))
        if clashing:
            raise InvalidRequestError(
                f"conf sets {', '.join(clashing)}: the nats connection {self.nats_conn_id!r} provides "
                "spark.jetstream.*; change the connection (or pass data source options in the job)",
                reason="conf_conflict",
            )


def _auth_kind(settings: ConnectionSettings) -> str:
    kinds = [name for name, on in (("user/password", settings.user), ("token", settings.token),
                                   ("nkey", settings.nkey_seed_secret), ("creds", settings.creds_file),
                                   ("tls client cert", settings.tls_cert_file)) if on]
    return "+".join(kinds) or "none"


def _failure_cause(recorded: Path, error: AirflowException) -> str | None:
    """The cause the job's driver recorded (airflow_jetstream/spark/failure.py), else the one in the spark-submit
    output Airflow's error carries (the Spark provider appends its last lines from 6.3.0 on), else None."""
    from airflow_jetstream.spark.failure import cause_in, recorded_cause

    return recorded_cause(recorded) or cause_in(str(error).partition("\n")[2])
