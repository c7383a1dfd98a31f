"""The live web dashboard, served at ``/`` by ``backchannel serve``."""

from __future__ import annotations

from fastapi import FastAPI


def mount_dashboard(app: FastAPI) -> None:
    """Add the dashboard's page, static assets and read endpoints to ``app``."""
