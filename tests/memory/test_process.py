"""``python -m loki_memory`` as a real process, logged in to NATS as its own user ``memory``
(the permissions table): the compose health command passes, it answers and announces under
those permissions, and SIGTERM stops it with status 0 within its budget."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from loki_shared import servers, subjects
from loki_shared.projects_client import ProjectsClient
from tests.conftest import login_env, plain_url


async def test_the_process_serves_as_its_own_user_and_stops_cleanly(
    service_env: dict[str, str], nc: NATS, redis_db: str
) -> None:
    env = {
        **service_env,
        **login_env("memory"),
        "LOKI_NATS_URL": plain_url(service_env["LOKI_NATS_URL"]),
        "LOKI_REDIS_URL": plain_url(redis_db),
        "LOKI_STOP_TIMEOUT_S": "5",
    }
    proc = servers.ManagedProcess("memory", [sys.executable, "-m", "loki_memory"], env=env)
    proc.start()
    try:
        health = [sys.executable, "-m", "loki_shared.health", "memory"]
        deadline = time.monotonic() + 60
        while True:
            done = await asyncio.to_thread(
                subprocess.run, health, env=env, capture_output=True, timeout=20
            )
            if done.returncode == 0:
                break
            assert proc.alive(), "\n".join(proc.tail)
            assert time.monotonic() < deadline, done.stderr
            await asyncio.sleep(0.3)

        seen: list[dict[str, object]] = []

        async def on_event(msg: Msg) -> None:
            seen.append(json.loads(msg.data))

        await nc.subscribe(subjects.PROJECTS_CHANGED, cb=on_event)
        await nc.flush()
        client = ProjectsClient.from_nats(nc)
        assert (await client.active_project()).id == "default"
        await client.write_page("default", "notes", "# Notes\nhello")
        assert (await client.block()).index == ["- [Notes](notes.md)"]
        for _ in range(50):
            if seen:
                break
            await asyncio.sleep(0.05)
        assert [(e["kind"], e["key"]) for e in seen] == [("page", "notes.md")]
        assert "Permissions Violation" not in "\n".join(proc.tail)

        assert proc.proc is not None
        t0 = time.monotonic()
        proc.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.proc.wait, 10)
        assert code == 0, "\n".join(proc.tail)
        assert time.monotonic() - t0 < 5 + 1
    finally:
        proc.stop(grace=2)
