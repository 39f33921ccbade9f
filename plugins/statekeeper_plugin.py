"""The Statekeeper Airflow plugin: the catalog API and pages, and a "Statekeeper" nav entry.

The app opens the catalog lazily (from ``STATEKEEPER_*`` settings) on its first request, so
loading the plugin costs no database connection.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from statekeeper_airflow.app import create_app

URL_PREFIX = "/statekeeper"

app = create_app()


class StatekeeperPlugin(AirflowPlugin):
    name = "statekeeper"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Statekeeper"}]
    external_views = [
        {
            "name": "Statekeeper",
            # Relative: the UI resolves it against its <base href> ([api] base_url), so the
            # link also works when Airflow is served under a sub-path.
            "href": f"{URL_PREFIX.lstrip('/')}/",
            # With a url_route the UI shows the page in an iframe at /plugin/statekeeper.
            "url_route": "statekeeper",
            "destination": "nav",
            "category": "browse",
        }
    ]
