"""Connection settings: everything needed to open a NATS connection, with secrets kept out of repr."""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, get_type_hints
from urllib.parse import urlsplit

from airflow_jetstream.client.durations import to_seconds
from airflow_jetstream.client.errors import InvalidRequestError, InvalidSettingsError
from airflow_jetstream.get_provider_info import CONN_FIELDS

DEFAULT_PORT = 4222
SECRET_FIELDS = ("password", "token", "nkey_seed_secret")
_SCHEMES = ("nats", "tls", "ws", "wss")


def parse_servers(value: str | list[str] | tuple[str, ...], default_port: int = DEFAULT_PORT) -> tuple[str, ...]:
    """Turn ``"h1:4222,tls://h2"`` (or a list) into full server URLs.

    Credentials embedded in URLs are refused: they belong in the connection's secret fields.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    servers = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        if "://" not in item:
            item = f"nats://{item}"
        parts = urlsplit(item)
        if parts.scheme not in _SCHEMES:
            raise InvalidSettingsError(
                f"server {parts.scheme}://{parts.hostname or ''} has scheme {parts.scheme!r}; "
                f"use one of {', '.join(_SCHEMES)}"
            )
        if parts.username or parts.password:
            raise InvalidSettingsError(
                "server URLs must not carry credentials; put them in the connection's login/password, "
                "token or nkey fields"
            )
        if not parts.hostname:
            raise InvalidSettingsError(f"server entry {raw.strip()!r} has no host name")
        try:
            port = parts.port or default_port
        except ValueError:
            raise InvalidSettingsError(f"server entry {raw.strip()!r} has an invalid port") from None
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        servers.append(f"{parts.scheme}://{host}:{port}")
    if not servers:
        raise InvalidSettingsError("no NATS server given: set the connection's host (e.g. 'nats1:4222,nats2:4222')")
    return tuple(servers)


@dataclass(frozen=True)
class ConnectionSettings:
    """How to reach a NATS server. Safe to pickle (Spark) and to repr (secrets are masked).

    The fields after ``password`` are the connection's extras (:data:`CONNECTION_FIELDS`).
    """

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    user: str | None = None
    password: str | None = None
    token: str | None = None
    nkey_seed_secret: str | None = None
    creds_file: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_verify: bool = True
    tls_hostname: str | None = None
    connect_timeout: float = 5.0
    client_name: str | None = "airflow-jetstream"
    domain: str | None = None
    api_prefix: str | None = None
    request_timeout: float = 5.0
    leader_wait: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.servers, (str, list)):
            object.__setattr__(self, "servers", parse_servers(self.servers))
        if self.connect_timeout <= 0 or self.request_timeout <= 0:
            raise InvalidSettingsError("connect_timeout and request_timeout must be positive seconds")
        if self.leader_wait < 0:
            raise InvalidSettingsError("leader_wait must be >= 0 seconds (0 turns election retries off)")
        if self.domain and self.api_prefix:
            raise InvalidSettingsError("set either a JetStream domain or an API prefix, not both")
        if self.token and (self.user or self.password):
            raise InvalidSettingsError("set either a token or user/password, not both")
        if self.password and not self.user:
            raise InvalidSettingsError("a password needs a user (login)")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise InvalidSettingsError("a TLS client certificate needs both tls_cert_file and tls_key_file")
        for name in ("creds_file", "tls_ca_file", "tls_cert_file", "tls_key_file"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise InvalidSettingsError(f"{name} {path!r} does not exist or is not a file")
            if path and not os.access(path, os.R_OK):
                raise InvalidSettingsError(f"{name} {path!r} cannot be read by this process (uid {os.getuid()}); "
                                           "check the file's owner and mode")
        if self.creds_file:
            with open(self.creds_file, "rb") as fh:
                text = fh.read().decode("utf-8", "replace")
            if "BEGIN NATS USER JWT" not in text or "BEGIN USER NKEY SEED" not in text:
                raise InvalidSettingsError(f"creds_file {self.creds_file!r} is not a NATS credentials file: it needs a "
                                           "'NATS USER JWT' and a 'USER NKEY SEED' block (nsc generate creds)")

    def __repr__(self) -> str:
        shown = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in SECRET_FIELDS:
                if value:
                    shown.append(f"{f.name}='***'")
                continue
            shown.append(f"{f.name}={value!r}")
        return f"ConnectionSettings({', '.join(shown)})"

    def with_overrides(self, **changes: Any) -> ConnectionSettings:
        """A copy with some fields changed."""
        return replace(self, **changes)

    @property
    def uses_tls(self) -> bool:
        return bool(
            self.tls_ca_file
            or self.tls_cert_file
            or not self.tls_verify
            or any(s.startswith(("tls://", "wss://")) for s in self.servers)
        )

    @property
    def api_subject_prefix(self) -> str:
        """The JetStream API prefix in use (``$JS.API`` unless a domain or prefix is set)."""
        if self.api_prefix:
            return self.api_prefix.rstrip(".")
        if self.domain:
            return f"$JS.{self.domain}.API"
        return "$JS.API"

    def ssl_context(self) -> ssl.SSLContext | None:
        """Build the TLS context, or None when TLS is not configured."""
        if not self.uses_tls:
            return None
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca_file)
            if self.tls_cert_file:
                ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        except (ssl.SSLError, OSError) as exc:
            raise InvalidSettingsError(
                f"cannot load TLS files (ca={self.tls_ca_file!r}, cert={self.tls_cert_file!r}): "
                f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc.args[-1]}"
            ) from None
        if not self.tls_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect`` (without callbacks); an unset one is nats-py's default, None."""
        tls = self.ssl_context()
        return {"servers": [s.replace("nats://", "tls://", 1) if tls else s for s in self.servers],
                "connect_timeout": self.connect_timeout, "name": self.client_name, "user": self.user,
                "password": (self.password or "") if self.user else None, "token": self.token,
                "nkeys_seed_str": self.nkey_seed_secret, "user_credentials": self.creds_file,
                "tls": tls, "tls_hostname": self.tls_hostname if tls else None}

    def secrets(self) -> list[str]:
        """Secret values to mask in logs (credentials file contents included)."""
        values = [v for v in (self.password, self.token, self.nkey_seed_secret) if v]
        if self.creds_file:
            with open(self.creds_file, encoding="utf-8", errors="replace") as fh:
                values.extend(creds_file_secrets(fh.read()))
        return values


#: A decorated block of a ``.creds`` file: ``-----BEGIN NATS USER JWT-----`` ... ``------END NATS USER JWT------``.
_CREDS_BLOCK = re.compile(r"^[ \t]*-{3,}[^\n]*BEGIN[^\n]*-{3,}[ \t]*\r?\n(.*?)^[ \t]*-{3,}[^\n]*END", re.M | re.S)


def creds_file_secrets(text: str) -> list[str]:
    """The key material of a ``.creds`` file (its user JWT and nkey seed), not its boilerplate.

    The lines inside each BEGIN/END block are secret; the markers, the ``IMPORTANT`` banner and the
    explanation around them are the same in every file and are not. A file without blocks holds only
    key material (every non-blank line of it is secret).
    """
    blocks = _CREDS_BLOCK.findall(text)
    lines = [line for block in blocks for line in block.splitlines()] if blocks else text.splitlines()
    return [line.strip() for line in lines if line.strip()]


@dataclass(frozen=True)
class FieldSpec:
    """One connection field beyond servers/user/password: its type, and whether it is secret.

    A ``secret`` field's name contains a word that Airflow's secret masker hides by default (``secret``,
    ``token``, ``password``, ...: it masks connection extras by key name in its connections API, the edit
    form and logs) and that Spark's default ``spark.redaction.regex`` redacts (``secret``, ``token``,
    ``password``), so neither shows the value without any configuration; a test holds every secret name to it.
    """

    kind: type
    secret: bool = False


#: The connection's extra fields, parsed by :func:`settings_from_fields`: their type from :class:`ConnectionSettings`,
#: their label, description and secrecy from ``CONN_FIELDS`` in get_provider_info.py (which imports nothing, so it
#: holds the form: Airflow reads it in every process; a test holds the form's types to the settings').
CONNECTION_FIELDS: dict[str, FieldSpec] = {
    f.name: FieldSpec(hint if (hint := get_type_hints(ConnectionSettings)[f.name]) in (bool, float) else str,
                      CONN_FIELDS[f.name]["schema"].get("format") == "password")
    for f in fields(ConnectionSettings) if f.name in CONN_FIELDS}


#: Every field :func:`settings_from_fields` accepts.
SETTINGS_FIELDS = ("servers", "user", "password", *CONNECTION_FIELDS)


def unknown_fields_error(unknown: list[str], known: tuple[str, ...] | list[str], what: str, *,
                         where: str = "") -> InvalidSettingsError:
    """The error for ``what`` names nobody knows (``where`` prefixes it), naming the ones it knows."""
    return InvalidSettingsError(f"{where}unknown {what}(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def parse_bool(name: str, value: Any) -> bool:
    """``true/false, 1/0, yes/no, on/off`` (any case) or a bool; anything else is an error."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on", "false", "0", "no", "off"):
        return text in ("true", "1", "yes", "on")
    raise InvalidSettingsError(f"{name} must be true or false, got {value!r}")


def _field_value(name: str, value: Any, what: str) -> Any:
    kind = CONNECTION_FIELDS[name].kind if name in CONNECTION_FIELDS else str
    if kind is bool:
        return parse_bool(f"{what} {name!r}", value)
    if kind is float:  # durations: seconds, a timedelta or '90s' (client/durations.py)
        try:
            return to_seconds(value, field=f"{what} {name!r}")
        except InvalidRequestError:
            raise InvalidSettingsError(f"{what} {name!r} must be a number of seconds or a duration like '90s', "
                                       f"got {value!r}") from None
    if not isinstance(value, str):
        raise InvalidSettingsError(f"{what} {name!r} must be a string")
    return value.strip()


def settings_from_fields(values: Mapping[str, Any], *, default_port: int = DEFAULT_PORT,
                         what: str = "connection field") -> ConnectionSettings:
    """The one parser of connection fields: ``servers``, ``user``, ``password`` and :data:`CONNECTION_FIELDS`.

    Values may be strings (Spark options, Spark conf, a JSON extra) or typed values; ``None`` and
    ``""`` mean unset. Unknown names are refused so a typo does not pass silently.
    """
    unknown = sorted(k for k in values if k not in SETTINGS_FIELDS)
    if unknown:
        raise unknown_fields_error(unknown, SETTINGS_FIELDS, what)
    parsed = {k: _field_value(k, v, what) for k, v in values.items() if v is not None and v != "" and k != "servers"}
    servers = values.get("servers")
    if servers:
        parsed["servers"] = parse_servers(servers, default_port=default_port)
    return ConnectionSettings(**parsed)


def settings_to_fields(settings: ConnectionSettings) -> dict[str, str]:
    """The settings as string fields (the inverse of :func:`settings_from_fields`; defaults left out)."""
    out: dict[str, str] = {}
    for f in fields(settings):
        value = getattr(settings, f.name)
        if value is None or value == f.default:
            continue
        out[f.name] = ",".join(value) if f.name == "servers" else str(value).lower() if isinstance(value, bool) \
            else str(value)
    out.setdefault("servers", ",".join(settings.servers))
    return out
