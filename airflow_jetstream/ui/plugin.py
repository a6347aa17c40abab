"""The Airflow plugin that mounts the JetStream view in the api-server and adds it to the UI's Browse menu.

Airflow loads it from the provider info's ``plugins`` entry when ``[core] lazy_discover_providers``
is False, and otherwise from the ``airflow.plugins`` entry point, which names :data:`ENTRY_POINT_PLUGIN`:
the plugin class with lazily discovered providers, None (skipped by Airflow without a message) when
the provider info loads it, so it is never registered twice.

Every Airflow process loads plugins (task processes too, for macros and listeners), so this module
stays cheap: the view's FastAPI app is imported on its first request, in the api-server only.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import conf
from airflow.sdk.plugins_manager import AirflowPlugin

from airflow_jetstream.ui.links import URL_PREFIX


class LazyViewApp:
    """ASGI app that imports :mod:`airflow_jetstream.ui.app` when the api-server first routes to it."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from airflow_jetstream.ui.app import app

            self._app = app
        await self._app(scope, receive, send)


class JetStreamViewPlugin(AirflowPlugin):
    """``/jetstream``: streams, consumers, sources, batch ledger and advisories per ``nats`` connection."""

    name = "jetstream"
    fastapi_apps = [{"app": LazyViewApp(), "url_prefix": URL_PREFIX, "name": "JetStream view"}]
    external_views = [{
        "name": "JetStream",
        "href": f"{URL_PREFIX}/",
        "url_route": "jetstream",
        "destination": "nav",
        "category": "browse",
    }]


ENTRY_POINT_PLUGIN = (
    JetStreamViewPlugin if conf.getboolean("core", "lazy_discover_providers", fallback=True) else None
)
