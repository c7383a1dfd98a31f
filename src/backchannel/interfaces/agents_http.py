"""HTTP routes for agent runtimes: hook receivers (``/v1/hooks/{runtime}``) and the MCP
server over streamable HTTP (``/mcp``)."""

from __future__ import annotations

from fastapi import FastAPI


def mount_agent_routes(app: FastAPI) -> None:
    """Add the hook receivers and the MCP endpoint to ``app``."""
