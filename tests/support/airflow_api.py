"""Airflow's REST API (``/api/v2``) as a client with a real login: a token from ``/auth/token``."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


class Api:
    """Calls to an api-server as ``user`` (the simple auth manager's admin in the local deployments).

    ``deployment`` is anything with ``url``, ``user`` and ``password`` (a ``LocalAirflow``, a namespace).
    """

    def __init__(self, deployment: Any) -> None:
        self.url = deployment.url
        token = self._call("POST", "/auth/token", {"username": deployment.user, "password": deployment.password})
        self.token = token["access_token"]

    def _request(self, method: str, path: str, body: dict | None, token: str | None) -> bytes:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.url + path, method=method, headers=headers,
                                         data=json.dumps(body).encode() if body is not None else None)
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.read()

    def _call(self, method: str, path: str, body: dict | None = None, token: str | None = None) -> Any:
        return json.loads(self._request(method, path, body, token))

    def call(self, method: str, path: str, body: dict | None = None) -> Any:
        """The JSON answer of ``method path`` (raises ``urllib.error.HTTPError`` on 4xx/5xx)."""
        return self._call(method, path, body, self.token)

    def text(self, method: str, path: str, body: dict | None = None) -> str:
        """The answer as it came over the wire (what a secret must not be in)."""
        return self._request(method, path, body, self.token).decode()
