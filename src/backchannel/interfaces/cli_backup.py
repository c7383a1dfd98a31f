"""``backchannel backup DEST``: a consistent copy of a SQLite store while its hubs run.

A ``cp`` of the database file is not one (what the hub committed last is in the ``-wal``
file beside it); see :mod:`backchannel.stores.sqlite.backup`. PostgreSQL has its own
tools (docs/postgres.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from backchannel import config
from backchannel.errors import BackchannelError
from backchannel.interfaces.cli_options import HomeOpt


def backup(
    dest: Annotated[Path, typer.Argument(help="The new file to write the copy to.")],
    store: Annotated[
        str | None,
        typer.Option(help="sqlite:///path [the data directory's SQLite file]"),
    ] = None,
    home: HomeOpt = None,
) -> None:
    """Copy a SQLite store to a new file, consistently, while hubs write to it."""
    from backchannel.interfaces import cli
    from backchannel.stores.sqlite.backup import backup as copy_store
    from backchannel.stores.sqlite.store import sqlite_path

    try:
        url = store or config.default_store_url(config.home(home))
        if not url.startswith("sqlite://"):
            cli._fail(
                f"backchannel backup copies a SQLite store, not {config.redact_url(url)}: "
                "back up PostgreSQL with pg_dump or pg_basebackup (docs/postgres.md)"
            )
        source = sqlite_path(url)
        version = copy_store(source, dest)
    except BackchannelError as exc:
        cli._fail(exc.message)
        raise
    cli.err.print(
        f"backed up {source} (schema version {version}) to {dest}. To restore it: stop "
        f"every hub on {source}, delete {source}-wal and {source}-shm, put the copy in "
        f"place of {source}, start the hub. Messages sent after the backup are not in it, "
        "and those received or acked after it are delivered again. Never run a hub on "
        "the copy beside one on the original: both would deliver the same messages.",
        markup=False,
    )


def register(app: typer.Typer) -> None:
    """Add ``backup`` to the ``backchannel`` CLI."""
    app.command()(backup)
