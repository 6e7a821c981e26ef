"""A first program: the invoice mail runs once, however often its job is delivered."""

import asyncio

import idemkit


async def send_invoice(attempt: idemkit.Attempt, order_id: str) -> str:
    print(f"mail for {order_id}, provider key {attempt.downstream_key}")
    return f"receipt-{order_id}"


async def main() -> None:
    coordinator = idemkit.Coordinator(idemkit.MemoryStore())  # or: await idemkit.RedisStore.connect(url)
    for delivery in range(3):  # the queue delivers the job three times: one mail
        receipt = await coordinator.call("mail.invoice", "order-9.invoice", ttl=3600).run(send_invoice, "order-9")
        print(f"delivery {delivery + 1}: {receipt}")


asyncio.run(main())
