"""Production servers from Python: Redis over TLS (``rediss://``, a CA file, a client
certificate) and as an ACL user, PostgreSQL with ``sslmode``. The Redis servers are the
test's own (``redis-server --tls-port``, certificates made with ``openssl``); PostgreSQL is
the machine's, which has ``ssl`` on.

Before the wheel had TLS built in, ``RedisStore.connect("rediss://…")`` failed with "can't
connect with TLS, the feature is not enabled" and ``sslmode=require`` with "SQLx was built
without TLS support enabled".
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from conftest import POSTGRES_URL, Mailer, unique

import idemkit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs() -> Iterator[Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed, and a
    second CA that signed nothing."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test's certificates")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d)
        for ca in ("ca", "other-ca"):
            openssl(path, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", f"/CN=idemkit pytest {ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.pem",
                    "-addext", "basicConstraints=critical,CA:TRUE")
        for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"),
                          ("client", "extendedKeyUsage=clientAuth\n")):
            (path / f"{name}.ext").write_text(ext)
            openssl(path, "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                    "-keyout", f"{name}.key", "-out", f"{name}.csr")
            openssl(path, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                    "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
        yield path


class TlsRedis:
    """A redis-server of the test's own: a plain port (for redis-py's setup) and a TLS port."""

    def __init__(self, certs: Path, *, mutual: bool) -> None:
        server = shutil.which("redis-server")
        if server is None:
            pytest.fail("redis-server is needed for the TLS tests")
        self.port, self.tls_port = free_port(), free_port()
        self.proc = subprocess.Popen(
            [server, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--tls-port", str(self.tls_port), "--tls-cert-file", str(certs / "server.pem"),
             "--tls-key-file", str(certs / "server.key"), "--tls-ca-cert-file", str(certs / "ca.pem"),
             "--tls-auth-clients", "yes" if mutual else "no"],
            stdout=subprocess.DEVNULL,
        )
        self.plain = redis.Redis(port=self.port)
        for _ in range(400):
            try:
                self.plain.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.025)
        self.proc.kill()
        pytest.fail("the test's redis-server did not start")

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.tls_port}"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


@pytest.fixture
def tls_redis(certs: Path) -> Iterator[TlsRedis]:
    server = TlsRedis(certs, mutual=False)
    yield server
    server.stop()


@pytest.fixture
def mutual_tls_redis(certs: Path) -> Iterator[TlsRedis]:
    server = TlsRedis(certs, mutual=True)
    yield server
    server.stop()


async def runs_once(store: idemkit.Store) -> None:
    coordinator, mailer, key = idemkit.Coordinator(store), Mailer(), unique("order")
    first = await coordinator.call("mail.invoice", key).run(mailer.send_invoice, key)
    again = await coordinator.call("mail.invoice", key).run(mailer.send_invoice, key)
    assert first == again
    assert mailer.sent == [key]


async def test_rediss_with_the_servers_ca(tls_redis: TlsRedis, certs: Path):
    store = await idemkit.RedisStore.connect(tls_redis.url, prefix=unique("tls"), ssl_ca_certs=str(certs / "ca.pem"))
    await runs_once(store)


def test_rediss_from_the_sync_api(tls_redis: TlsRedis, certs: Path):
    store = idemkit.RedisStore.connect_sync(tls_redis.url, prefix=unique("tls"), ssl_ca_certs=str(certs / "ca.pem"))
    coordinator, sent = idemkit.Coordinator(store), []

    def send(attempt: idemkit.Attempt) -> str:
        sent.append(1)
        return "em_1"

    key = unique("order")
    assert coordinator.call("mail.invoice", key).run_sync(send) == "em_1"
    assert coordinator.call("mail.invoice", key).run_sync(send) == "em_1"
    assert sent == [1]


async def test_an_untrusted_certificate_is_refused_not_unavailable(tls_redis: TlsRedis, certs: Path):
    with pytest.raises(idemkit.StoreError) as refused:
        await idemkit.RedisStore.connect(tls_redis.url, ssl_ca_certs=str(certs / "other-ca.pem"))
    assert not isinstance(refused.value, idemkit.StoreUnavailable)


async def test_tls_options_with_a_plain_url_are_refused(tls_redis: TlsRedis, certs: Path):
    with pytest.raises(idemkit.StoreError, match="rediss://"):
        await idemkit.RedisStore.connect(f"redis://127.0.0.1:{tls_redis.port}", ssl_ca_certs=str(certs / "ca.pem"))


async def test_a_client_certificate_for_a_server_that_asks(mutual_tls_redis: TlsRedis, certs: Path):
    with pytest.raises(idemkit.StoreError):
        await idemkit.RedisStore.connect(mutual_tls_redis.url, ssl_ca_certs=str(certs / "ca.pem"))
    store = await idemkit.RedisStore.connect(
        mutual_tls_redis.url,
        prefix=unique("mtls"),
        ssl_ca_certs=str(certs / "ca.pem"),
        ssl_certfile=str(certs / "client.pem"),
        ssl_keyfile=str(certs / "client.key"),
    )
    await runs_once(store)
    with pytest.raises(idemkit.StoreError, match="together"):
        await idemkit.RedisStore.connect(
            mutual_tls_redis.url, ssl_ca_certs=str(certs / "ca.pem"), ssl_certfile=str(certs / "client.pem")
        )


async def test_an_acl_user_limited_to_the_stores_keys(tls_redis: TlsRedis):
    prefix = unique("acl")
    tls_redis.plain.acl_setuser(
        "worker", enabled=True, passwords=["+s3cret"], keys=[f"{prefix}:{{*"], channels=[f"{prefix}:{{*"],
        commands=["+@all", "-@dangerous"],
    )
    url = f"redis://127.0.0.1:{tls_redis.port}"
    for store in (
        await idemkit.RedisStore.connect(url, prefix=prefix, username="worker", password="s3cret"),
        await idemkit.RedisStore.connect(f"redis://worker:s3cret@127.0.0.1:{tls_redis.port}", prefix=prefix),
    ):
        await runs_once(store)
    # Nothing the store sent was refused, but the eviction check's CONFIG GET.
    denied = [entry for entry in tls_redis.plain.acl_log() if entry.get("object") != "config|get"]
    assert denied == []
    with pytest.raises(idemkit.StoreError) as refused:
        await idemkit.RedisStore.connect(url, prefix=prefix, username="worker", password="wrong")
    assert not isinstance(refused.value, idemkit.StoreUnavailable)


async def test_postgres_with_sslmode_require():
    url = POSTGRES_URL + ("&" if "?" in POSTGRES_URL else "?") + "sslmode=require"
    store = await idemkit.PostgresStore.connect(url, table=f"idemkit_tls_{os.getpid()}")
    await runs_once(store)


async def test_the_drop_in_carries_a_tls_clients_ca_and_user(tls_redis: TlsRedis, certs: Path):
    # Before: a redis-py client with ssl=True was connected in plain text, failed, and every
    # action ran unprotected (fail-open, one warning).
    import redis.asyncio

    prefix = unique("dropin-tls")
    tls_redis.plain.acl_setuser(
        "worker", enabled=True, passwords=["+s3cret"], keys=[f"{prefix}:*"], channels=[f"{prefix}:*"],
        commands=["+@all", "-@dangerous"],
    )
    client = redis.asyncio.Redis(
        host="127.0.0.1", port=tls_redis.tls_port, username="worker", password="s3cret",
        ssl=True, ssl_ca_certs=str(certs / "ca.pem"),
    )
    repo = idemkit.RedisAsyncIdempotencyRepository(client, key_prefix=prefix + ":")
    c, sent = idemkit.AsyncIdempotencyCoordinator(repo, on_storage_error="raise"), []

    async def send() -> dict:
        sent.append(1)
        return {"n": len(sent)}

    for _ in range(2):
        assert await c.coordinate("mail.invoice", "order-9", 60, idemkit.JsonResultAdapter(), send) == {"n": 1}
    assert sent == [1]
    # The records are on that server, under the prefix.
    assert tls_redis.plain.keys(f"{prefix}:*") != []
    await client.aclose()
