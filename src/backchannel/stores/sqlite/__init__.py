"""The embedded SQLite store: :mod:`.store` (connections, the writer thread and its group
commit), :mod:`.schema` (tables and migrations), :mod:`.tx` (the :class:`Tx`)."""

from backchannel.stores.sqlite.schema import MIGRATIONS
from backchannel.stores.sqlite.store import SqliteStore, sqlite_path
from backchannel.stores.sqlite.tx import SqliteTx

__all__ = ["MIGRATIONS", "SqliteStore", "SqliteTx", "sqlite_path"]
