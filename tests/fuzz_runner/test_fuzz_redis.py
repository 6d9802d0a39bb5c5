"""Campaigns on two machines sharing one Redis example database (a real
``redis-server`` on a loopback port): a failure found by one is replayed
first by the other, before any search.

Skipped, with the reason, where ``redis-server`` or the ``redis`` client (a
test extra) is missing; .ci/run installs both.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUGGY = f"{ROOT / 'tests' / 'fuzz_targets' / 'toy_properties.py'}::test_buggy_sum_matches_builtin"
FLEET_MODULE = """
import os

import redis
from hypothesis.extra.redis import RedisExampleDatabase

database = RedisExampleDatabase(redis.Redis(host="127.0.0.1", port=int(os.environ["FUZZ_REDIS_PORT"])))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_port(tmp_path: Path) -> Iterator[int]:
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does)")
    try:
        import redis
    except ImportError:
        pytest.skip("the redis client is not installed (pip install -e '.[dev]' in the checkout)")
    port = _free_port()
    proc = subprocess.Popen(
        [
            server,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.skip(f"redis-server did not start on port {port} (exit {proc.poll()})")
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _campaign(machine: Path, port: int, seed: int) -> dict:
    machine.mkdir(exist_ok=True)
    (machine / "fleetdb.py").write_text(FLEET_MODULE)
    report = machine / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "simdist",
            "fuzz",
            "--budget",
            "20",
            "--seed",
            str(seed),
            "-x",
            "--no-corpus",
            "--database",
            "python:fleetdb:database",
            "--report",
            str(report),
            BUGGY,
        ],
        cwd=machine,
        env={**os.environ, "FUZZ_REDIS_PORT": str(port)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return json.loads(report.read_text())


def test_a_failure_found_by_one_campaign_replays_first_in_another(tmp_path, redis_port):
    first = _campaign(tmp_path / "machine-a", redis_port, seed=11)
    [found] = first["failures"]
    assert found["case"] == {"values": [0, 0, 0, 1]}
    # Another machine (its own folder, no local database), another seed.
    second = _campaign(tmp_path / "machine-b", redis_port, seed=12)
    [again] = second["failures"]
    assert again["cases_before_first_failure"] == 0, "the shared failure was not replayed first"
    assert again["case"] == found["case"]
