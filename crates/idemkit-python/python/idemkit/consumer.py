"""The seed's consumer in one piece: the inbox and the database effect in one transaction,
then the external effect under the effect's key, and the message acknowledged only after.

    handler = idemkit.InboxHandler(
        coordinator, "invoice.send", inbox, pool.acquire, consumer="billing",
        key=lambda order: f"{order['id']}.invoice",
        database=insert_invoice,          # async (message, conn): in the inbox's transaction
        external=send_invoice_email,      # async (message, attempt): every run, downstream key
    )
    await idemkit.kafka.run(kafka_consumer, handler, decode=json.loads)

It is the Rust crate's ``Inbox::handler`` (idemkit-postgres), in the only order that neither
repeats nor loses an effect; ``idemkit.kafka.run`` is the Kafka loop (aiokafka) that commits a
message's offset only once its result is stored.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from ._coordinator import DEFAULT_TTL, Attempt, Coordinator
from .inbox import Inbox

M = TypeVar("M")


class InboxHandler(Generic[M]):
    """Handles one message ``M``, on every delivery of it, in the seed's order:

    1. one transaction on a connection from ``connection()``: the inbox's claim of
       ``key(message)`` for ``consumer`` and, if it is new, ``database(message, conn)`` (the
       invoice row), then commit (a claim already committed skips the database effect: an
       earlier delivery committed it and died after);
    2. ``external(message, attempt)`` (the email), on every run, with the attempt whose
       ``downstream_key`` the receiving API should get: a run after a crash between the email
       and the completion sends it again with the same downstream key, which such an API
       answers without a second email;
    3. its value is the call's result: stored under ``key(message)`` and replayed to every
       later delivery, which then runs nothing. Acknowledge the message only after.

    Steps 1 and 2 run as the action of one coordinator call under ``key(message)``: two
    deliveries at once wait for each other. ``key`` names the **effect** (``order-9.invoice``),
    for the call and the claim alike: a producer's retry of the same order is another message
    and must find the order's claim. ``connection`` returns an async context manager of a
    connection (asyncpg's ``pool.acquire``) or an awaitable of one (``lambda:
    psycopg.AsyncConnection.connect(url)``).
    """

    __slots__ = ("coordinator", "operation", "inbox", "connection", "consumer", "key", "database", "external", "ttl")

    def __init__(
        self,
        coordinator: Coordinator,
        operation: str,
        inbox: Inbox,
        connection: Callable[[], Any],
        *,
        consumer: str,
        key: Callable[[M], str],
        database: Callable[[M, Any], Awaitable[None]],
        external: Callable[[M, Attempt], Awaitable[Any]],
        ttl: float = DEFAULT_TTL,
    ) -> None:
        self.coordinator, self.operation, self.inbox = coordinator, operation, inbox
        self.connection, self.consumer, self.key = connection, consumer, key
        self.database, self.external, self.ttl = database, external, ttl

    async def __call__(self, message: M) -> Any:
        """Handles one delivery of ``message``; returns the effect's value (stored or replayed)."""
        key = self.key(message)

        async def action(attempt: Attempt) -> Any:
            opened = self.connection()
            if not hasattr(opened, "__aenter__"):
                opened = await opened  # psycopg's connect(): the connection is the manager
            async with opened as conn, conn.transaction():
                if await self.inbox.claim(conn, self.consumer, key):
                    await self.database(message, conn)
            return await self.external(message, attempt)

        return await self.coordinator.call(self.operation, key, ttl=self.ttl).run(action)

    def __repr__(self) -> str:
        return f"InboxHandler({self.operation!r}, consumer={self.consumer!r})"


__all__ = ["InboxHandler"]
