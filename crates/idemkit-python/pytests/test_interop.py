"""Records shared across languages: a Rust worker (examples/interop_worker.rs) and a Python
worker (interop_worker.py), two processes on one key, on Redis and on PostgreSQL."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import POSTGRES_URL, REDIS_URL, postgres_store, redis_store, unique

ROOT = Path(__file__).resolve().parents[3]
PYTHON_WORKER = Path(__file__).with_name("interop_worker.py")


@pytest.fixture(scope="module")
def rust_worker() -> str:
    built = os.environ.get("IDEMKIT_INTEROP_WORKER")
    if built:
        return built
    subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "idemkit-python", "--example", "interop_worker"],
        cwd=ROOT,
        check=True,
    )
    return str(ROOT / "target" / "release" / "examples" / "interop_worker")




def target(kind: str) -> tuple[str, str]:
    if kind == "redis":
        return REDIS_URL, unique("interop")
    return POSTGRES_URL, "idemkit_records"


async def reachable(kind: str) -> None:
    # Fails under CI, skips elsewhere, when the server is down.
    await (redis_store() if kind == "redis" else postgres_store())


def start(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["redis", "postgres"])
async def test_a_rust_worker_and_a_python_worker_race_on_one_key_and_one_effect_happens(kind, rust_worker, tmp_path):
    await reachable(kind)
    url, namespace = target(kind)
    for round in range(3):
        key, effects = unique(f"race-{round}"), tmp_path / f"effects-{round}"
        at = str(int(time.time() * 1000) + 800)
        rust = start([rust_worker, url, namespace, key, str(effects), "rust", "400", at])
        python = start([sys.executable, str(PYTHON_WORKER), url, namespace, key, str(effects), "python", "400", at])
        a, b = finish(rust), finish(python)
        ran = effects.read_text().split()
        assert len(ran) == 1, f"round {round}: effects {ran}"
        assert a["value"] == b["value"] == f"{ran[0]}-receipt"
        assert sorted([a["replayed"], b["replayed"]]) == [False, True]


@pytest.mark.parametrize("kind", ["redis", "postgres"])
async def test_each_language_replays_the_record_the_other_wrote(kind, rust_worker, tmp_path):
    await reachable(kind)
    url, namespace = target(kind)
    for first, second in [("rust", "python"), ("python", "rust")]:
        key, effects = unique(f"{first}-writes"), tmp_path / f"{first}-writes"

        def worker(name: str) -> list[str]:
            if name == "rust":
                return [rust_worker, url, namespace, key, str(effects), "rust", "0"]
            return [sys.executable, str(PYTHON_WORKER), url, namespace, key, str(effects), "python", "0"]

        wrote = finish(start(worker(first)))
        replayed = finish(start(worker(second)))
        assert wrote == {"value": f"{first}-receipt", "replayed": False}
        assert replayed == {"value": f"{first}-receipt", "replayed": True}
        assert effects.read_text().split() == [first]
