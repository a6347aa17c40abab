"""JetStreamSparkSubmitOperator: spark-submit with the ``nats`` connection handed to the job.

Needs the ``spark`` extra (the Spark provider): without it, importing this module raises Airflow's
``AirflowOptionalProviderFeatureException`` naming the extra, so a DAG file using the operator fails to
parse with that message while the rest of the provider works. A DAG file that imports this module pays
for Airflow's ``SparkSubmitOperator`` only: the Spark side of the provider (``airflow_jetstream.spark``,
which imports pyspark) is imported when the task runs.

What spark-submit needs on the host that runs it is checked here too: a Celery worker host runs the Spark driver
(client mode), so it needs Java and a Python that can run the job. These checks import Airflow, so they are not in
spark/, which executors receive as a zip without Airflow; the executors' hosts are named in the job's failure
instead (airflow_jetstream/spark/driver.py), since only the job reaches them. Without them, ``spark-class`` prints
"JAVA_HOME is not set", or the JVM "Cannot run program "python3.9"", and the task fails with the Spark provider's
"Cannot execute: spark-submit ..." and the whole command line: nothing says which host lacks what. The operator
checks first and fails in one line naming the host (Airflow's ``[core] hostname_callable``, the name the UI shows
for the task) and the fix.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from airflow.providers.common.compat.sdk import AirflowOptionalProviderFeatureException
from airflow.sdk.exceptions import AirflowException

try:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
except ModuleNotFoundError as missing:
    if not (missing.name or "").startswith("airflow.providers.apache"):
        raise
    raise AirflowOptionalProviderFeatureException(
        "JetStreamSparkSubmitOperator needs the Spark provider (apache-airflow-providers-apache-spark), which "
        'comes with the spark extra: pip install "airflow-jetstream[spark]"') from missing

from airflow_jetstream.client.errors import InvalidRequestError, SparkInstallError
from airflow_jetstream.client.settings import ConnectionSettings
from airflow_jetstream.hooks.jetstream import JetStreamHook
from airflow_jetstream.ui.links import JetStreamLedgerRunLink, JetStreamViewLink

PROPERTIES_NAME = "jetstream-spark.properties"
#: The file the job's driver records the cause of its failure in (airflow_jetstream/spark/driver.py).
FAILURE_NAME = "failure.txt"


#: A cause naming an executor host that cannot run the job (airflow_jetstream/spark/driver.py).
_INSTALL_CAUSE = re.compile(r"SparkInstallError: (?P<message>.*) \(reason: (?P<reason>\w+)\)")

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


def properties_text(settings: ConnectionSettings, base: str | Path | None = None,
                    job_conf: Mapping[str, str] | None = None) -> str:
    """``base`` (a properties file, or spark-defaults.conf) plus the connection's ``spark.jetstream.*`` entries
    (and ``job_conf``, the operator's ``spark.jetstream.job.*`` keys), as a properties file's text."""
    from airflow_jetstream.spark.driver import settings_to_conf

    if not base:  # spark-defaults.conf as spark-submit would load it (--properties-file replaces that file)
        spark_home = os.environ.get("SPARK_HOME")
        conf_dir = os.environ.get("SPARK_CONF_DIR") or (os.path.join(spark_home, "conf") if spark_home else None)
        defaults = Path(conf_dir, "spark-defaults.conf") if conf_dir else None
        base = defaults if defaults and defaults.is_file() else None
    lines = [Path(base).read_text(encoding="utf-8").rstrip("\n")] if base else []
    entries = {**settings_to_conf(settings), **(job_conf or {})}
    lines += [f"{key}={_escape(value)}" for key, value in sorted(entries.items())]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def handed_properties(text: str, folder: str | Path) -> Iterator[tuple[str, tuple[int, ...]]]:
    """The properties ``text`` as (the path spark-submit reads, the descriptors it must inherit for it).

    On Linux the file has no name (``O_TMPFILE``, readable by its owner only): spark-submit reads it as
    ``/dev/fd/N`` of a descriptor it inherits, so the kernel frees it with the last process holding it, even
    one killed with SIGKILL. Elsewhere it is ``folder``/jetstream-spark.properties (``0600``), removed with
    ``folder`` when spark-submit returns.
    """
    if sys.platform.startswith("linux"):
        with tempfile.TemporaryFile("w", encoding="utf-8", dir=folder) as unnamed:
            unnamed.write(text)
            unnamed.flush()
            yield f"/dev/fd/{unnamed.fileno()}", (unnamed.fileno(),)
        return
    fd = os.open(Path(folder, PROPERTIES_NAME), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as named:
        named.write(text)
    yield str(Path(folder, PROPERTIES_NAME)), ()


#: The oldest Python the package runs on (pyproject.toml's requires-python): the driver runs it.
OLDEST_PYTHON = (3, 11)

#: Where spark-submit's PythonRunner takes the driver's Python from, first match wins (conf, then environment).
DRIVER_PYTHON_CONF = ("spark.pyspark.driver.python", "spark.pyspark.python")
DRIVER_PYTHON_ENV = ("PYSPARK_DRIVER_PYTHON", "PYSPARK_PYTHON")

#: What the driver's Python prints: its version, then whether it imports the package (when it must).
_PROBE = ("import importlib.util, sys\nprint('%d.%d' % sys.version_info[:2])\n"
          "print(all(importlib.util.find_spec(name) for name in sys.argv[1:]))")


def java_missing(env: Mapping[str, str]) -> str | None:
    """What spark-class would not find in ``env`` (it runs ``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else the
    ``java`` on PATH), or None when there is a Java to run."""
    java_home = env.get("JAVA_HOME")
    if java_home:
        binary = os.path.join(java_home, "bin", "java")
        return None if os.access(binary, os.X_OK) else f"JAVA_HOME={java_home} has no bin/java"
    if shutil.which("java", path=env.get("PATH", "")) is None:
        return "JAVA_HOME is not set and no java on PATH"
    return None


def this_host() -> str:
    """The task's host as Airflow names it (``[core] hostname_callable``), else the kernel's host name."""
    try:
        from airflow.utils.net import get_hostname

        return str(get_hostname())
    except Exception:  # an Airflow without it, or a hostname_callable that fails: the kernel's name still helps
        return os.uname().nodename


def check_java(env: Mapping[str, str], host: str | None = None) -> None:
    """Raise :class:`SparkInstallError` (``java_missing``) in one line naming the host when ``env`` has no Java."""
    missing = java_missing(env)
    if missing is not None:
        raise SparkInstallError(
            f"host {host or this_host()}: no Java for spark-submit ({missing}): install Java 17 on this host (it runs "
            "the Spark driver) or set JAVA_HOME in its environment", reason="java_missing")


def driver_python(conf: Mapping[str, str], env: Mapping[str, str]) -> tuple[str, str]:
    """``(python, where it was named)``: the Python spark-submit runs the driver with, as its PythonRunner picks it."""
    for source, names in ((conf, DRIVER_PYTHON_CONF), (env, DRIVER_PYTHON_ENV)):
        for name in names:
            if source.get(name):
                return source[name], name
    return "python3", "Spark's default"


def conf_in_properties(text: str) -> dict[str, str]:
    """The ``spark.*`` entries of a properties file's text (``key=value`` or ``key value``, as spark-defaults.conf)."""
    found = {}
    for line in text.splitlines():
        match = re.match(r"\s*(spark\.[^\s=:]+)\s*[=:\s]\s*(.*?)\s*$", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def check_driver_python(conf: Mapping[str, str], env: Mapping[str, str], *, needs_package: bool,
                        host: str | None = None) -> str:
    """Run the driver's Python once (``python -c``) and raise :class:`SparkInstallError` in one line naming the host
    when it does not run here (``python_missing``), is older than the package supports (``python_mismatch``) or
    cannot import ``airflow_jetstream`` when the job is not shipped it (``package_missing``; pyspark is not checked:
    spark-submit puts its own on the driver's path). Returns its version."""
    python, named_by = driver_python(conf, env)
    where = f"host {host or this_host()}: the Spark driver's Python {python!r} ({named_by})"
    modules = ["airflow_jetstream"] if needs_package else []
    try:
        done = subprocess.run([python, "-c", _PROBE, *modules], env=dict(env), capture_output=True, text=True,
                              timeout=60, check=False)
        lines = done.stdout.split()
        problem = None if done.returncode == 0 and len(lines) == 2 else f"exit code {done.returncode}"
    except OSError as exc:
        problem = exc.strerror
    if problem is not None:
        raise SparkInstallError(f"{where} does not run ({problem}): install it on this host or name one that is "
                                "installed", reason="python_missing")
    version, imports = lines
    if tuple(int(part) for part in version.split(".")) < OLDEST_PYTHON:
        raise SparkInstallError(
            f"{where} is Python {version}; the package needs {'.'.join(map(str, OLDEST_PYTHON))} or newer: name a "
            "newer one", reason="python_mismatch")
    if imports != "True":
        raise SparkInstallError(
            f"{where} (Python {version}) has no airflow_jetstream: install airflow-jetstream[spark] into it, name "
            "the Python that has it, or pass ship_package=True", reason="package_missing")
    return version


#: prctl(2) option: the signal the kernel sends this process when the thread that started it ends.
_PR_SET_PDEATHSIG = 1


def dies_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when the process starting it dies, however it
    dies (prctl ``PR_SET_PDEATHSIG``; it survives ``exec``, so it holds for spark-submit's JVM). None where
    the kernel has no such signal (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


class _TaskChildSubmitHook(SparkSubmitHook):
    """The provider's hook, starting spark-submit as a child that cannot outlive the task: killed by the kernel
    when the task process dies (:func:`dies_with_this_process`), inheriting the descriptor of its properties."""

    inherited_fds: tuple[int, ...] = ()

    def submit(self, application: str = "", **kwargs: Any) -> str | None:
        preexec = dies_with_this_process()
        if preexec is not None:
            kwargs.setdefault("preexec_fn", preexec)
        return super().submit(application, pass_fds=self.inherited_fds, **kwargs)


class JetStreamSparkSubmitOperator(SparkSubmitOperator):
    """A ``SparkSubmitOperator`` whose job reaches NATS with the ``nats_conn_id`` connection.

    The connection reaches the job as ``spark.jetstream.*`` conf in a private properties file given with
    ``--properties-file``, never on the command line (secrets under ``spark.jetstream.secret.*``, which Spark
    redacts); a given ``properties_file`` (else spark-defaults.conf) is merged into it. The application calls
    :func:`airflow_jetstream.spark.register`. ``ship_package`` adds a zip of the package and nats-py to
    ``py_files``; ``stream`` only feeds the task's "JetStream" link. spark-submit does not inherit the task's
    secret variables (:func:`secret_variables`): they are set empty in ``env_vars`` (yours win). See
    docs/operators/spark-submit.md.
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
        from airflow_jetstream.spark.driver import FAILURE_FILE_CONF
        from airflow_jetstream.spark.package import PACKAGE_ZIP, build_py_files, check_pyspark_install

        given_properties, given_py_files, given_env = self.properties_file, self.py_files, self.env_vars
        blanked = dict.fromkeys(secret_variables(os.environ), "")
        env_vars = {**blanked, **(given_env or {})} if blanked else given_env
        env = {**os.environ, **(env_vars or {})}  # spark-submit's environment (the Spark provider's)
        check_pyspark_install()  # spark-submit comes from the installed pyspark
        check_java(env)
        settings = JetStreamHook(nats_conn_id=self.nats_conn_id).get_settings()  # registers secrets for masking
        self._refuse_conf_overrides()
        with tempfile.TemporaryDirectory(prefix="jetstream-spark-") as tmp:
            failure = Path(tmp, FAILURE_NAME)
            text = properties_text(settings, given_properties, {FAILURE_FILE_CONF: str(failure)})
            check_driver_python({**conf_in_properties(text), **{k: str(v) for k, v in (self.conf or {}).items()}},
                                env, needs_package=not (self.ship_package or given_py_files))
            with handed_properties(text, tmp) as (properties, fds):
                if self.ship_package:
                    shipped = str(build_py_files(Path(tmp, PACKAGE_ZIP)))
                    self.py_files = f"{given_py_files},{shipped}" if given_py_files else shipped
                self.properties_file, self.env_vars = properties, env_vars
                self._hook = self._task_child_hook(fds)
                self.log.info("nats connection %r handed to the Spark job: %d server(s), auth %s, via "
                              "--properties-file%s", self.nats_conn_id, len(settings.servers), _auth_kind(settings),
                              " (package shipped with --py-files)" if self.ship_package else "")
                try:
                    super().execute(context)  # type: ignore[arg-type]
                except AirflowException as exc:
                    cause = _failure_cause(failure, exc)
                    if cause is None:
                        raise
                    install = _INSTALL_CAUSE.fullmatch(cause)
                    if install:  # an executor's host cannot run the job: the typed error, in one line
                        raise SparkInstallError(install["message"], reason=install["reason"]) from exc
                    raise AirflowException(f"the Spark job failed: {cause}") from exc
                finally:
                    self.properties_file, self.py_files, self.env_vars = given_properties, given_py_files, given_env

    def _task_child_hook(self, fds: tuple[int, ...]) -> _TaskChildSubmitHook:
        """The hook the provider builds (its arguments change between provider versions), as a
        :class:`_TaskChildSubmitHook` that hands spark-submit ``fds``."""
        hook = self._get_hook()
        hook.__class__ = _TaskChildSubmitHook
        child = cast("_TaskChildSubmitHook", hook)
        child.inherited_fds = fds
        return child

    def _refuse_conf_overrides(self) -> None:
        from airflow_jetstream.spark.driver import CONF_PREFIX

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
    """The cause the job's driver recorded (airflow_jetstream/spark/driver.py), else the one in the spark-submit
    output Airflow's error carries (the Spark provider appends its last lines from 6.3.0 on), else None."""
    from airflow_jetstream.spark.driver import cause_in

    recorded_text = recorded.read_text(encoding="utf-8").strip() if recorded.is_file() else ""
    return recorded_text or cause_in(str(error).partition("\n")[2])
