"""The transactional inbox, in your own PostgreSQL transaction (asyncpg or psycopg 3, async or not).

The inbox row is written by the connection that writes the database effect, inside its
transaction: both commit, or neither does, and a redelivered message finds its row and skips
the effect. It is the Rust crate's ``Inbox`` (the same table, the same claim statement), so a
message claimed by a Rust consumer is a duplicate to a Python one.

    inbox = idemkit.Inbox()
    await inbox.migrate(DATABASE_URL)                      # once, at start-up
    async with conn.transaction():                          # asyncpg
        if await inbox.claim(conn, "orders", message_id):   # True: first delivery
            await conn.execute("INSERT INTO ledger (order_id) VALUES ($1)", order_id)
    # the email is an external effect: it needs its key (coordinator.call), not the inbox

The claim waits on a concurrent uncommitted claim of the same message (a row lock), so two
deliveries in flight at once cannot both see it as new.
"""

from __future__ import annotations

import re
from typing import Any

from . import _native
from ._coordinator import _reply, _reply_sync

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class Inbox:
    """The inbox table ``schema.table`` (default ``public.idemkit_inbox``), rows kept ``retention`` seconds."""

    __slots__ = ("schema", "table", "retention", "_sql", "_psycopg_sql")

    def __init__(self, *, table: str = "idemkit_inbox", schema: str = "public", retention: float = 7 * 86400) -> None:
        for name in (schema, table):
            if not _NAME.match(name):
                from ._errors import InvalidKey

                raise InvalidKey(f"not a plain SQL name: {name!r}")
        if retention <= 0:
            raise ValueError(f"retention must be positive, got {retention}")
        self.schema, self.table, self.retention = schema, table, retention
        t = f'"{schema}"."{table}"'
        # The Rust crate's claim (idemkit-postgres src/inbox.rs): inserted, or an expired row
        # renewed, returns a row (new); a live row returns none (a duplicate).
        self._sql = (
            f"INSERT INTO {t} AS i (consumer, message_id, received_at, expires_at) "
            "VALUES ($1, $2, clock_timestamp(), clock_timestamp() + $3 * interval '1 microsecond') "
            "ON CONFLICT (consumer, message_id) DO UPDATE "
            "SET received_at = excluded.received_at, expires_at = excluded.expires_at "
            "WHERE i.expires_at <= excluded.received_at RETURNING true"
        )
        self._psycopg_sql = re.sub(r"\$\d", "%s", self._sql)  # psycopg's placeholders

    async def migrate(self, url: str) -> None:
        """Creates the table if it is missing (idempotent; concurrent callers queue on a lock)."""
        await _reply(_native.migrate_inbox, url, self.schema, self.table)

    async def claim(self, conn: Any, consumer: str, message_id: str) -> bool:
        """Claims ``message_id`` for ``consumer`` in ``conn``'s open transaction: ``True`` the
        first time (run the database effect), ``False`` for a duplicate (skip it).

        ``conn`` is an asyncpg connection or a psycopg 3 ``AsyncConnection``/``AsyncCursor``.
        Raises ``InvalidKey`` for a consumer or message id the core refuses, before anything
        is sent.
        """
        _native.validate(consumer, message_id)
        micros = int(self.retention * 1_000_000)
        if hasattr(conn, "fetchval"):  # asyncpg
            return bool(await conn.fetchval(self._sql, consumer, message_id, micros))
        # psycopg 3: a cursor from the connection or the cursor itself.
        cursor = await conn.execute(self._psycopg_sql, (consumer, message_id, micros))
        return (await cursor.fetchone()) is not None

    def migrate_sync(self, url: str) -> None:
        """``migrate`` for code outside an event loop."""
        _reply_sync(_native.migrate_inbox, url, self.schema, self.table)

    def claim_sync(self, conn: Any, consumer: str, message_id: str) -> bool:
        """``claim`` in a psycopg 3 ``Connection``'s (or ``Cursor``'s) open transaction, for
        code outside an event loop: ``True`` the first time, ``False`` for a duplicate."""
        _native.validate(consumer, message_id)
        cursor = conn.execute(self._psycopg_sql, (consumer, message_id, int(self.retention * 1_000_000)))
        return cursor.fetchone() is not None

    def __repr__(self) -> str:
        return f"Inbox({self.schema}.{self.table}, retention={self.retention}s)"
