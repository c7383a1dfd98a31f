"""The PostgreSQL store: :mod:`.store` (the pool, transactions and the listener),
:mod:`.schema` (tables and migrations), :mod:`.tx` (the :class:`Tx`)."""

from backchannel.stores.postgres.schema import _MIGRATION_LOCK, MIGRATIONS
from backchannel.stores.postgres.store import LISTENER_NAME, PostgresStore, mask_url
from backchannel.stores.postgres.tx import PgTx

__all__ = ["LISTENER_NAME", "MIGRATIONS", "_MIGRATION_LOCK", "PgTx", "PostgresStore", "mask_url"]
