"""`loki backup` and `loki restore` round trip, on the real engine.

A stack runs; two conversations are chatted and compacted (so their big blocks are archived,
one of them while the memory is encrypted); `loki backup` reads the running stack; the stack
stops; `loki restore` fills a fresh LOKI_HOME (fresh Redis and NATS); a new stack on it serves
byte for byte the same conversations, display logs, exports, archived blocks (the private one
after unlocking with the same passphrase), memory state and perf counters.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from httpx_sse import connect_sse

from loki_cli.stack import Stack, StackConfig
from loki_shared import servers

from .conftest import StackClient

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PASSPHRASE = "backup passphrase for the test"
MEMORY_PASSPHRASE = "memory passphrase for the test"
FILE = "\n".join(f"line {i:03d}: value = {i * 7919 % 1000:03d}  # checksum row" for i in range(40))


def loki(
    *args: str, home: Path, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(LOKI_HOME=str(home), LOKI_BACKUP_PASSPHRASE=PASSPHRASE)
    env.update(extra or {})
    exe = Path(sys.executable).parent / "loki"
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=300)


def start(home: Path, metrics_port: int) -> Stack:
    env = {
        "LOKI_CTX": "4096",
        "LOKI_MAX_TOKENS": "96",
        "LOKI_PERF_METRICS_PORT": str(metrics_port),
    }
    stack = Stack(StackConfig(home=home, web_port=servers.free_port(), env=env, echo=False))
    stack.start()
    try:
        stack.wait_engine_ready(timeout=240)
    except BaseException:
        stack.stop()
        raise
    return stack


def compacted_conversation(client: StackClient, topic: str) -> str:
    conv = client.send(f"Here is the {topic} file, keep it in mind:\n{FILE}\nReply with: ok")
    client.events(conv)
    client.wait_idle(conv)
    for text in ("What is a checksum? One sentence.", "Thanks. One word answer: done?"):
        client.send(text, conv)
        client.wait_idle(conv)
    r = client.http.post("/api/chat/compact", json={"conversation": conv}, timeout=600)
    # "nothing compacted" when the turns already compacted it (a verbose model fills the
    # window): either way the file's block must be archived, which the caller checks.
    assert r.status_code == 200, r.text
    client.wait_idle(conv)
    return conv


def replay(client: StackClient, conv: str) -> bytes:
    """The whole display log as the SSE stream replays it from the start (ids and data, in
    order), read up to the conversation's last seq."""
    last = client.http.get("/api/chat/state", params={"conversation": conv}).json()["last_seq"]
    assert last > 0
    out: list[tuple[str, str]] = []
    with httpx.Client(base_url=client.base, timeout=httpx.Timeout(60, read=30)) as http:
        with connect_sse(
            http, "GET", "/api/chat", params={"conversation": conv}, headers={"Last-Event-ID": "0"}
        ) as source:
            for sse in source.iter_sse():
                if sse.event != "message" or not sse.data:
                    continue  # pings
                out.append((sse.id, sse.data))
                if int(json.loads(sse.data)["seq"]) >= last:
                    break
    return repr(out).encode()


def counters(port: int) -> list[str]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sorted(
        line
        for line in text.splitlines()
        if re.match(
            r"lokiassist_(completions|prompt_tokens|prompt_tokens_cached|generated_tokens)_total\{",
            line,
        )
    )


def settled(port: int) -> list[str]:
    """The counters once they stop moving (read 3 s apart)."""
    deadline = time.monotonic() + 30
    while True:
        first = counters(port)
        time.sleep(3)
        if first and counters(port) == first:
            return first
        assert time.monotonic() < deadline, first


def views(client: StackClient, convs: list[str], seqs: list[int]) -> dict[str, bytes]:
    """What the APIs serve, as bytes."""
    out: dict[str, bytes] = {}
    out["conversations"] = client.http.get("/api/conversations").content
    for conv in convs:
        state = client.http.get("/api/chat/state", params={"conversation": conv}).json()
        # the tools the engine's template withheld: the owning chat instance's memory of its
        # last step, not stored data (a restored stack has taken no step yet);
        state.pop("tools_unavailable", None)
        # ctx_used: the meter's figure (the engine's last measure, or exact counts made again
        # after a restart), a runtime measure rather than stored data
        state.pop("ctx_used", None)
        out[f"state {conv}"] = json.dumps(state, sort_keys=True).encode()
        out[f"export {conv}"] = client.http.get(f"/api/conversations/{conv}/export").content
        out[f"log {conv}"] = replay(client, conv)
    out["blocks"] = client.http.get("/api/recall/blocks").content
    for seq in seqs:
        r = client.http.get("/api/recall/block", params={"seq": str(seq)})
        out[f"block {seq}"] = r.status_code.to_bytes(2, "big") + r.content
    return out


def test_backup_of_a_running_stack_restores_into_a_fresh_home(tmp_path: Path) -> None:
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    port_a, port_b = servers.free_port(), servers.free_port()
    backup = tmp_path / "backups" / "loki.lokibak"
    backup.parent.mkdir()

    stack = start(home_a, port_a)
    try:
        client = StackClient(f"http://127.0.0.1:{stack.config.web_port}")
        plain = compacted_conversation(client, "inventory")
        r = client.http.post("/api/memory/unlock", json={"passphrase": MEMORY_PASSPHRASE})
        assert r.json() == {"state": "unlocked"}, r.text
        private = compacted_conversation(client, "ledger")
        blocks = client.http.get("/api/recall/blocks").json()["blocks"]
        by_conv = {b["conversation"] for b in blocks}
        assert {plain, private} <= by_conv, blocks  # both compactions archived a block
        seqs = [b["seq"] for b in blocks]
        settled(port_a)  # the perf service has counted every completion
        before = views(client, [plain, private], seqs)
        metrics_before = counters(port_a)
        summary_before = client.http.get("/api/perf/summary").json()

        # Backed up while everything runs; the key never appears in clear in the file.
        out = loki("backup", str(backup), home=home_a)
        assert out.returncode == 0, out.stdout + out.stderr
        assert backup.stat().st_mode & 0o777 == 0o600
        key_text = (home_a / "secret.key").read_text().strip().encode()
        data = backup.read_bytes()
        assert key_text not in data and MEMORY_PASSPHRASE.encode() not in data
        assert b"checksum row" not in data
        # The stack keeps serving after the backup; a restore into its home is refused.
        assert client.http.get("/api/conversations").content == before["conversations"]
        busy = loki("restore", str(backup), home=home_a)
        assert busy.returncode == 1 and "Loki is running" in busy.stderr, busy.stderr
    finally:
        stack.stop()

    # A restore refuses a LOKI_HOME whose stack runs, and a wrong passphrase.
    bad = loki(
        "restore", str(backup), home=home_b, extra={"LOKI_BACKUP_PASSPHRASE": "wrong passphrase!!"}
    )
    assert bad.returncode == 1 and "wrong passphrase" in bad.stderr, bad.stderr
    assert not (home_b / "secret.key").exists()

    out = loki("restore", str(backup), home=home_b)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (home_b / "secret.key").read_text() == (home_a / "secret.key").read_text()
    again = loki("restore", str(backup), home=home_b)
    assert again.returncode == 1 and "nothing was restored" in again.stderr, again.stderr

    stack = start(home_b, port_b)
    try:
        client = StackClient(f"http://127.0.0.1:{stack.config.web_port}")
        assert client.http.get("/api/memory").json() == {"state": "locked"}
        deadline = time.monotonic() + 60
        while counters(port_b) != metrics_before:
            assert time.monotonic() < deadline, (counters(port_b), metrics_before)
            time.sleep(1)
        summary_after = client.http.get("/api/perf/summary").json()
        assert summary_after["completions"] == summary_before["completions"]
        # The private block cannot be read before the memory is unlocked...
        locked = views(client, [plain, private], seqs)
        r = client.http.post("/api/memory/unlock", json={"passphrase": MEMORY_PASSPHRASE})
        assert r.json() == {"state": "unlocked"}, r.text
        deadline = time.monotonic() + 20  # ...and can once recall holds the key again
        while (after := views(client, [plain, private], seqs))["blocks"] != before["blocks"]:
            assert time.monotonic() < deadline, after["blocks"][:500]
            time.sleep(1)
    finally:
        stack.stop()
    assert after.keys() == before.keys()
    for name in before:
        assert after[name] == before[name], name
    assert locked["blocks"] != before["blocks"] or any(
        locked[f"block {s}"] != before[f"block {s}"] for s in seqs
    )
