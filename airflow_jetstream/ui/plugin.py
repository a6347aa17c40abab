"""The Airflow plugin that mounts the JetStream view in the api-server and adds it to the UI's Browse menu.

Airflow loads it from the provider info's ``plugins`` entry when ``[core] lazy_discover_providers``
is False, and otherwise from the ``airflow.plugins`` entry point, which names :data:`ENTRY_POINT_PLUGIN`:
the plugin class with lazily discovered providers, None (skipped by Airflow without a message) when
the provider info loads it, so it is never registered twice.
"""

from __future__ import annotations

from airflow import settings
from airflow.plugins_manager import AirflowPlugin

from airflow_jetstream.ui.app import app
from airflow_jetstream.ui.links import URL_PREFIX


class JetStreamViewPlugin(AirflowPlugin):
    """``/jetstream``: streams, consumers, sources, batch ledger and advisories per ``nats`` connection."""

    name = "jetstream"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "JetStream view"}]
    external_views = [{
        "name": "JetStream",
        "href": f"{URL_PREFIX}/",
        "url_route": "jetstream",
        "destination": "nav",
        "category": "browse",
    }]


ENTRY_POINT_PLUGIN = JetStreamViewPlugin if settings.LAZY_LOAD_PROVIDERS else None
