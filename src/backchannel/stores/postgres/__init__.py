"""The PostgreSQL store, laid out as the SQLite one: :mod:`.store` (the pool, the retry
loop and the listener), :mod:`.schema` (tables and migrations), :mod:`.tx` (the
:class:`Tx`), and :mod:`.transaction` under it (team locks, the history buffer, ``COMMIT``
and the wake-ups after it), which SQLite's single writer does not need."""

from backchannel.stores.postgres.schema import _MIGRATION_LOCK, MIGRATIONS
from backchannel.stores.postgres.store import LISTENER_NAME, PostgresStore, mask_url
from backchannel.stores.postgres.tx import PgTx

__all__ = ["LISTENER_NAME", "MIGRATIONS", "_MIGRATION_LOCK", "PgTx", "PostgresStore", "mask_url"]
