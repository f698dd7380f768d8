"""The compose check's stack (issue 36), shared by the tests of this folder: built and brought
up once per session by :mod:`tests.compose.stack`, taken down (volumes too) at the end."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loki_shared import servers

from .stack import CACHE, Compose, prepare

#: seconds `up --wait` may take: the engine loads the model on CPU within its start period
UP_TIMEOUT_S = 600


def _record(name: str, seconds: float) -> None:
    """Keep the last figures in the build cache (``compose-check/timings.json``)."""
    path = CACHE / "compose-check" / "timings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = round(seconds, 1)
    path.write_text(json.dumps(data, indent=1))


@pytest.fixture(scope="session")
def compose_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compose-check")


@pytest.fixture(scope="session")
def compose(compose_workdir: Path) -> Iterator[Compose]:
    """The stack, up and healthy: CPU engine profile, stand-ins for registry images."""
    _record("prepare_s", prepare())
    c = Compose(compose_workdir, servers.free_port())
    c("down", "--volumes", "--remove-orphans", timeout=300)  # a run killed half-way
    t0 = time.monotonic()
    c("build", timeout=3600)
    _record("build_s", time.monotonic() - t0)
    t0 = time.monotonic()
    c("up", "--detach", "--wait", "--wait-timeout", str(UP_TIMEOUT_S), timeout=UP_TIMEOUT_S + 120)
    _record("up_s", time.monotonic() - t0)
    try:
        yield c
    finally:
        c("down", "--volumes", "--remove-orphans", timeout=300)
