"""The web server: a JSON API and a dashboard rendered on the server (``plangate serve``)."""

from plangate.server.app import create_app

__all__ = ["create_app"]
