"""Tidemark's Airflow plugin: the watermark page, served by the api-server at
``/tidemark/`` and shown from the UI's navigation (see ``tidemark_airflow/ui.py``)."""

from airflow.plugins_manager import AirflowPlugin
from tidemark_airflow.ui import URL_PREFIX, app


class TidemarkPlugin(AirflowPlugin):
    name = "tidemark"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Tidemark watermarks"}]
    # Relative hrefs resolve against the UI's base URL, so a proxied base path keeps working.
    external_views = [
        {
            "name": "Watermarks",
            "href": "tidemark/",
            "icon": "tidemark/icon.svg",
            "url_route": "tidemark",
            "destination": "nav",
        }
    ]
