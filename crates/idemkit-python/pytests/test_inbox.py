"""The transactional inbox in an asyncpg transaction: the row commits with the effect."""

import pytest
from conftest import POSTGRES_URL, postgres_store, unique

import idemkit

asyncpg = pytest.importorskip("asyncpg")


async def test_a_message_claimed_in_a_committed_transaction_is_a_duplicate_and_a_rolled_back_one_is_not():
    await postgres_store()  # fails under CI, skips elsewhere, when PostgreSQL is down
    inbox = idemkit.Inbox(table="idemkit_inbox_py")
    await inbox.migrate(POSTGRES_URL)
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS py_ledger (message text)")
        message = unique("m")

        class Boom(Exception):
            pass

        with pytest.raises(Boom):
            async with conn.transaction():
                assert await inbox.claim(conn, "orders", message) is True
                await conn.execute("INSERT INTO py_ledger VALUES ($1)", message)
                raise Boom  # the effect and the claim roll back together
        for delivery in range(3):
            async with conn.transaction():
                if await inbox.claim(conn, "orders", message):
                    await conn.execute("INSERT INTO py_ledger VALUES ($1)", message)
        assert await conn.fetchval("SELECT count(*) FROM py_ledger WHERE message = $1", message) == 1
        with pytest.raises(idemkit.InvalidKey):
            await inbox.claim(conn, "orders", "")
    finally:
        await conn.close()


def test_bad_names_are_refused():
    with pytest.raises(idemkit.InvalidKey):
        idemkit.Inbox(table='x"; DROP TABLE y; --')
    with pytest.raises(ValueError):
        idemkit.Inbox(retention=0)


async def test_the_claim_runs_in_a_psycopg_transaction_too():
    psycopg = pytest.importorskip("psycopg")
    await postgres_store()
    inbox = idemkit.Inbox(table="idemkit_inbox_py")
    await inbox.migrate(POSTGRES_URL)
    async with await psycopg.AsyncConnection.connect(POSTGRES_URL) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS py_ledger (message text)")
        await conn.commit()
        message = unique("m")
        for delivery in range(3):
            async with conn.transaction():
                if await inbox.claim(conn, "orders", message):
                    await conn.execute("INSERT INTO py_ledger VALUES (%s)", (message,))
        cursor = await conn.execute("SELECT count(*) FROM py_ledger WHERE message = %s", (message,))
        assert (await cursor.fetchone())[0] == 1
