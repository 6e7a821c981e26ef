"""RQ and Dramatiq, for real: a worker process of each example on the machine's Redis, one
order enqueued three times (a producer that retried, a broker that redelivered): one mail.
And ``idemkit.per_process``, which the examples make their coordinator with."""

import os
import pathlib
import subprocess
import sys
import time

import pytest
import redis
from conftest import REDIS_URL, _require, unique

import idemkit

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def require_redis() -> redis.Redis:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.RedisError as e:
        _require(f"redis at {REDIS_URL}", e)
    return client


def example_env(prefix: str, **more: str) -> dict[str, str]:
    return {
        **os.environ,
        "IDEMKIT_REDIS_URL": REDIS_URL,
        "IDEMKIT_PREFIX": prefix,
        "PYTHONPATH": str(EXAMPLES),
        **more,
    }


def test_rq_jobs_enqueued_three_times_mail_once():
    if not os.environ.get("CI"):
        pytest.importorskip("rq")
    import rq

    client, prefix, queue_name = require_redis(), unique("rq"), unique("invoices")
    env = example_env(prefix)
    # The jobs are enqueued by name, as another service would: the worker imports the example.
    queue = rq.Queue(queue_name, connection=client)
    jobs = [queue.enqueue("rq_worker.send_invoice", "order-9") for _ in range(3)]
    done = subprocess.run(
        [sys.executable, "-m", "rq.cli", "worker", "--burst", "--url", REDIS_URL, queue_name],
        cwd=EXAMPLES,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert [job.latest_result().return_value for job in jobs] == ["em_1"] * 3
    assert client.llen(f"{prefix}:mails") == 1


def test_dramatiq_messages_sent_three_times_mail_once():
    if not os.environ.get("CI"):
        pytest.importorskip("dramatiq")
    client, prefix, queue_name = require_redis(), unique("dramatiq"), unique("invoices")
    env = example_env(prefix, DRAMATIQ_QUEUE=queue_name)
    sender = (
        "import dramatiq_worker\n"
        "for _ in range(3):\n"
        "    dramatiq_worker.send_invoice.send('order-9')\n"
    )
    subprocess.run([sys.executable, "-c", sender], cwd=EXAMPLES, env=env, check=True, timeout=60)
    worker = subprocess.Popen(
        [sys.executable, "-m", "dramatiq", "dramatiq_worker", "--processes", "2", "--threads", "2",
         "--queues", queue_name],
        cwd=EXAMPLES,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while client.llen(f"{prefix}:receipts") < 3 and time.monotonic() < deadline:
            assert worker.poll() is None, worker.stderr.read().decode() if worker.stderr else ""
            time.sleep(0.1)
        assert client.lrange(f"{prefix}:receipts", 0, -1) == [b"em_1"] * 3
        assert client.llen(f"{prefix}:mails") == 1
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def test_per_process_makes_one_value_per_process():
    made: list[int] = []

    def factory() -> idemkit.Coordinator:
        made.append(os.getpid())
        return idemkit.Coordinator(idemkit.MemoryStore())

    current = idemkit.per_process(factory)
    assert current() is current()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, b"1" if current() is current() and made[-1] == os.getpid() else b"0")
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    os.close(read)
    assert made == [os.getpid()]  # the parent's made once; the child's was the child's
