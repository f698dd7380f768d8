"""Recall service speed: archive rate, recall / recall_search latency, memory, restart time.

Runs everything for real on loopback: its own NATS and Redis (temporary directories), the
recall service as ``python -m loki_recall``, the requests over NATS. Archives N blocks of about
2 KB (default 100,000: about 200 MB of text) and measures, in the same run:

- archive rate (blocks/s, 64 requests in flight);
- ``recall_search`` latency p50 / p99 over a mix of queries (common and rare words, several
  words, 2-3 letter substrings), end to end over NATS;
- ``recall`` latency p50 / p99;
- the plain full scan the original did per search (read every block from Redis, open, lower,
  score), timed over the same blocks, and the answers of both compared (they must be equal);
- the recall service's resident memory (VmRSS, and the peak VmHWM) against the archived text;
- restart: SIGTERM (the service saves its index snapshot), start again, time until a
  ``recall_search`` is answered; then the same without the snapshot (cold: every block read
  and indexed again).

Usage: ``python bench/recall_bench.py [--blocks N] [--quick]``; results go to
``bench/results/recall.json`` (``--quick``: 5,000 blocks, to ``recall-quick.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats
from redis.asyncio import Redis

from loki_recall.archive import BLOCKS_KEY, _decode, block_aad
from loki_recall.text import keywords
from loki_recall.tools import hits_text, reference_search
from loki_shared import servers, subjects
from loki_shared.messages.recall import (
    ArchiveReply,
    ArchiveRequest,
    Block,
    PurgeReply,
    PurgeRequest,
    RecallScope,
    ToolReply,
    ToolRequest,
)
from loki_shared.recall_label import recall_label
from loki_shared.sealing import Sealer, key_from_text

SECRET = "bench-secret-key-0123456789"
ROOT = Path(__file__).resolve().parent


def make_vocabulary(rng: random.Random, n: int) -> list[str]:
    syll = [
        "ka",
        "to",
        "ri",
        "men",
        "sol",
        "dé",
        "pra",
        "vi",
        "lo",
        "ne",
        "stu",
        "ar",
        "qu",
        "ix",
        "bo",
        "tel",
        "gra",
        "zu",
        "fé",
        "or",
        "an",
        "el",
        "cy",
        "dro",
        "mé",
    ]
    words = set()
    while len(words) < n:
        words.add("".join(rng.choice(syll) for _ in range(rng.randint(1, 4))))
    return sorted(words)


def make_block(rng: random.Random, vocab: list[str], weights: list[float], i: int) -> tuple:
    """One ~2 KB block: prose-like lines of Zipf-distributed words, code-like identifiers,
    and a couple of unique tokens (ids, hashes) so the vocabulary keeps growing."""
    words = rng.choices(vocab, cum_weights=weights, k=300)
    lines, line = [], []
    for j, w in enumerate(words):
        line.append(w.capitalize() if j % 17 == 0 else w)
        if len(line) >= rng.randint(8, 14):
            lines.append(" ".join(line))
            line = []
    lines.append(f"id_{i:06d} hash {rng.getrandbits(64):016x} err={rng.randint(0, 999)};")
    content = "\n".join(lines)
    while len(content) < 1900:
        content += "\n" + " ".join(rng.choices(vocab, cum_weights=weights, k=20))
    content = content[:2100]
    tool = rng.choice(["read_file", "web_fetch", "run_shell", None])
    role = "tool" if tool else "user"
    return role, tool, content


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def rss_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1])
    return out


class Service:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "loki_recall"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)


async def ask_tool(
    nc, name: str, arguments: dict, timeout: float = 30.0, scope: RecallScope | None = None
) -> tuple[str, float]:
    body = ToolRequest(name=name, arguments=arguments, scope=scope).model_dump_json().encode()
    t0 = time.perf_counter()
    msg = await nc.request(subjects.RECALL_TOOL, body, timeout=timeout)
    dt = time.perf_counter() - t0
    reply = ToolReply.model_validate_json(msg.data)
    if reply.error is not None:
        raise RuntimeError(reply.error.message)
    return reply.text, dt


async def wait_serving(nc, proc: subprocess.Popen, timeout: float = 300) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError("recall service exited")
        try:
            await ask_tool(nc, "recall_search", {"query": "probe"}, timeout=1.0)
            return time.perf_counter() - t0
        except Exception:  # noqa: BLE001 - not serving yet
            await asyncio.sleep(0.05)
    raise RuntimeError("recall service not serving")


async def full_scan(redis: Redis, sealer: Sealer, kws: set[str], limit: int) -> list[Block]:
    """What the original did per search: read, open and lower every block, score them all."""
    blocks: list[Block] = []
    cursor = 0
    while True:
        cursor, batch = await redis.hscan(BLOCKS_KEY, cursor, count=2000)
        for field, blob in batch.items():
            seq = int(field)
            blocks.append(_decode(seq, sealer.open(blob, block_aad(seq))[1:]))
        if cursor == 0:
            break
    return reference_search(blocks, kws, limit)


def make_queries(rng: random.Random, vocab: list[str], n: int) -> list[dict]:
    queries = []
    for i in range(n):
        kind = i % 5
        if kind == 0:  # one common word
            q = rng.choice(vocab[:200])
        elif kind == 1:  # one rare word
            q = rng.choice(vocab[len(vocab) // 2 :])
        elif kind == 2:  # three words, mixed
            q = " ".join(rng.choice(vocab) for _ in range(3))
        elif kind == 3:  # a 2-3 letter fragment (substring semantics)
            w = rng.choice(vocab)
            q = w[: rng.choice([2, 3])]
        else:  # an id, as the model would look for one it saw
            q = f"id_{rng.randint(0, 99999):06d} err"
        queries.append({"query": q, "limit": rng.choice([5, 5, 10, 20])})
    return queries


async def measure(n_blocks: int, out_path: Path | None = None) -> dict:
    """Run the whole measurement on ``n_blocks`` blocks; the raw figures (and written to
    ``out_path`` when given)."""
    rng = random.Random(42)
    vocab = make_vocabulary(rng, 30_000)
    weights = []
    acc = 0.0
    for rank in range(1, len(vocab) + 1):
        acc += 1.0 / rank
        weights.append(acc)
    tmp = Path(tempfile.mkdtemp(prefix="loki-recall-bench-"))
    nport, rport = servers.free_port(), servers.free_port()
    (tmp / "nats").mkdir()
    (tmp / "redis").mkdir()
    nats_proc = servers.ManagedProcess("nats", servers.nats_command(nport, tmp / "nats")).start()
    redis_proc = servers.ManagedProcess("redis", servers.redis_command(rport, tmp / "redis"))
    redis_proc.start()
    nats_proc.wait_port(nport)
    redis_proc.wait_port(rport)
    nats_url, redis_url = f"nats://127.0.0.1:{nport}", f"redis://127.0.0.1:{rport}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(
        LOKI_NATS_URL=nats_url,
        LOKI_REDIS_URL=redis_url,
        LOKI_HOME=str(tmp / "home"),
        LOKI_SECRET_KEY=SECRET,
        LOKI_LOG_LEVEL="WARNING",
    )
    service = Service(env)
    result: dict = {
        "blocks": n_blocks,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
    }
    nc = await nats.connect(nats_url)
    redis = Redis.from_url(redis_url)
    try:
        service.start()
        await wait_serving(nc, service.proc)
        rss_empty = rss_kib(service.proc.pid)["VmRSS"]

        # --- archive --------------------------------------------------------------------
        specs = [make_block(rng, vocab, weights, i) for i in range(n_blocks)]
        text_bytes = sum(len(c.encode("utf-8")) for _, _, c in specs)
        sem = asyncio.Semaphore(64)

        async def archive_one(
            role: str, tool: str | None, content: str, conversation: str = "bench"
        ) -> int:
            req = ArchiveRequest(
                label=recall_label(role, content, tool),
                role=role,
                tool_name=tool,
                content=content,
                conversation=conversation,
            )
            async with sem:
                msg = await nc.request(
                    subjects.RECALL_ARCHIVE, req.model_dump_json().encode(), timeout=60
                )
            reply = ArchiveReply.model_validate_json(msg.data)
            if reply.error is not None:
                raise RuntimeError(reply.error.message)
            return reply.seq

        t0 = time.perf_counter()
        seqs = await asyncio.gather(*(archive_one(*s) for s in specs))
        archive_s = time.perf_counter() - t0
        assert sorted(seqs) == list(range(1, n_blocks + 1))
        del specs
        mem = rss_kib(service.proc.pid)
        result["archive"] = {
            "seconds": round(archive_s, 2),
            "blocks_per_s": round(n_blocks / archive_s, 1),
            "text_bytes": text_bytes,
        }

        # --- recall_search and recall latency ---------------------------------------------
        queries = make_queries(rng, vocab, 400)
        for q in queries[:20]:  # warm-up
            await ask_tool(nc, "recall_search", q)
        search_times, answers = [], []
        for q in queries:
            text, dt = await ask_tool(nc, "recall_search", q)
            search_times.append(dt)
            answers.append(text)
        recall_times = []
        for _ in range(1000):
            seq = rng.randint(1, n_blocks)
            text, dt = await ask_tool(nc, "recall", {"id": f"r{seq}"})
            assert text.startswith(f"[r{seq} · ")
            recall_times.append(dt)
        result["recall_search_ms"] = {
            "p50": round(pct(search_times, 50) * 1000, 2),
            "p99": round(pct(search_times, 99) * 1000, 2),
            "max": round(max(search_times) * 1000, 2),
            "queries": len(queries),
            "hits_mean": round(statistics.mean(a.count("\n- r") for a in answers), 2),
        }
        kinds = ["common word", "rare word", "three words", "2-3 letter fragment", "id + word"]
        result["recall_search_ms_by_kind"] = {
            kind: {
                "p50": round(pct(search_times[k::5], 50) * 1000, 2),
                "p99": round(pct(search_times[k::5], 99) * 1000, 2),
            }
            for k, kind in enumerate(kinds)
        }
        result["recall_ms"] = {
            "p50": round(pct(recall_times, 50) * 1000, 3),
            "p99": round(pct(recall_times, 99) * 1000, 3),
            "calls": len(recall_times),
        }

        # --- the same queries as the chat service sends them: scoped to the default project
        scoped_times = []
        for i, q in enumerate(queries[:200]):
            text, dt = await ask_tool(nc, "recall_search", q, scope=RecallScope())
            assert text == answers[i], ("scoped answer differs", q)
            scoped_times.append(dt)
        result["recall_search_scoped_ms"] = {
            "p50": round(pct(scoped_times, 50) * 1000, 2),
            "p99": round(pct(scoped_times, 99) * 1000, 2),
            "queries": len(scoped_times),
            "answers_equal": len(scoped_times),
        }

        # --- full-scan baseline, and the same answers ---------------------------------------
        sealer = Sealer(key_from_text(SECRET))
        scan_times, checked = [], 0
        for i in range(0, len(queries), max(1, len(queries) // 5))[:5]:
            q = queries[i]
            t0 = time.perf_counter()
            want = await full_scan(redis, sealer, keywords(q["query"]), q["limit"])
            scan_times.append(time.perf_counter() - t0)
            want_text = hits_text(want) if keywords(q["query"]) else answers[i]
            assert answers[i] == want_text, ("indexed answer differs from full scan", q)
            checked += 1
        result["full_scan_ms"] = {
            "mean": round(statistics.mean(scan_times) * 1000, 1),
            "queries": len(scan_times),
            "answers_equal": checked,
        }
        result["speedup_p50"] = round(statistics.mean(scan_times) / pct(search_times, 50), 1)

        # --- memory ---------------------------------------------------------------------
        result["memory"] = {
            "rss_empty_mib": round(rss_empty / 1024, 1),
            "rss_after_archive_mib": round(mem["VmRSS"] / 1024, 1),
            "hwm_after_archive_mib": round(mem["VmHWM"] / 1024, 1),
            "text_mib": round(text_bytes / 2**20, 1),
        }

        # --- restart ----------------------------------------------------------------------
        t0 = time.perf_counter()
        service.stop()  # saves the index snapshot
        result["stop_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        service.start()
        await wait_serving(nc, service.proc, timeout=600)
        restart_s = time.perf_counter() - t0
        mem2 = rss_kib(service.proc.pid)
        text, _ = await ask_tool(nc, "recall_search", queries[1])
        assert text == answers[1], "answer changed after restart"
        result["restart_s"] = round(restart_s, 2)
        # the same without the snapshot: every block read, opened and indexed again
        service.stop()
        (tmp / "home" / "recall-index.snap").unlink()
        t0 = time.perf_counter()
        service.start()
        await wait_serving(nc, service.proc, timeout=600)
        result["restart_cold_s"] = round(time.perf_counter() - t0, 2)
        mem3 = rss_kib(service.proc.pid)
        text, _ = await ask_tool(nc, "recall_search", queries[2])
        assert text == answers[2], "answer changed after a cold restart"
        result["memory"].update(
            rss_after_restart_mib=round(mem2["VmRSS"] / 1024, 1),
            hwm_after_restart_mib=round(mem2["VmHWM"] / 1024, 1),
        )
        result["memory"].update(
            rss_after_cold_restart_mib=round(mem3["VmRSS"] / 1024, 1),
            hwm_after_cold_restart_mib=round(mem3["VmHWM"] / 1024, 1),
        )
        # --- deleting a conversation (issue 28): its 200 blocks, in one request ------------
        doomed = [
            await archive_one("tool", "read_file", f"purgeable{i:03d}zz block {i}", "bench-delete")
            for i in range(200)
        ]
        await ask_tool(nc, "recall_search", {"query": "purgeable007zz"})  # indexed
        body = PurgeRequest(conversation="bench-delete").model_dump_json().encode()
        t0 = time.perf_counter()
        msg = await nc.request(subjects.RECALL_PURGE, body, timeout=120)
        purge_s = time.perf_counter() - t0
        purged = PurgeReply.model_validate_json(msg.data)
        assert purged.error is None and purged.seqs == doomed, purged.error
        text, _ = await ask_tool(nc, "recall_search", {"query": "purgeable007zz"})
        assert text == "[no archived block matches]", text
        after = [(await ask_tool(nc, "recall_search", q))[1] for q in queries[:100]]
        result["delete_conversation"] = {
            "blocks": len(doomed),
            "request_ms": round(purge_s * 1000, 1),
            "recall_search_p50_after_ms": round(pct(after, 50) * 1000, 2),
        }
        worst_rss = max(mem["VmRSS"], mem2["VmRSS"], mem3["VmRSS"]) * 1024
        result["memory"]["rss_over_text"] = round(worst_rss / text_bytes, 2)
        result["memory"]["growth_over_text"] = round((worst_rss - rss_empty * 1024) / text_bytes, 2)
        result["targets"] = {
            "recall_search_p50_le_20ms": result["recall_search_ms"]["p50"] <= 20,
            "recall_search_p99_le_100ms": result["recall_search_ms"]["p99"] <= 100,
            "recall_p50_le_5ms": result["recall_ms"]["p50"] <= 5,
            "archive_ge_500_per_s": result["archive"]["blocks_per_s"] >= 500,
            "rss_lt_3x_text": result["memory"]["rss_over_text"] < 3,
            "restart_le_30s": restart_s <= 30,
        }
    finally:
        service.stop()
        await nc.drain()
        await redis.aclose()
        redis_proc.stop()
        nats_proc.stop()
    result["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=2) + "\n")
    return result


#: Harness time limits (s): quick = 5,000 blocks, full = 100,000 blocks.
TIMEOUT_S = {"quick": 600, "full": 3600}


def run(quick: bool) -> dict:
    """Harness entry point (bench/README.md): 5,000 blocks in quick mode, 100,000 in full."""
    from bench import _common

    raw = asyncio.run(measure(5_000 if quick else 100_000))
    search, recall_ms = raw["recall_search_ms"], raw["recall_ms"]
    scan_ms = raw["full_scan_ms"]["mean"]
    mem = raw["memory"]
    return _common.result(
        f"Recall service: {raw['blocks']:,} archived blocks (issue 3)",
        tables=[
            _common.table(
                "recall_search against the plain full scan, same blocks, same run",
                ["figure", "value"],
                [
                    ["recall_search p50 (ms)", search["p50"]],
                    ["recall_search p99 (ms)", search["p99"]],
                    ["full scan mean (ms)", scan_ms],
                    ["full scan / recall_search p50", raw["speedup_p50"]],
                    ["answers equal to the full scan", raw["full_scan_ms"]["answers_equal"]],
                    ["recall_search scoped p50 (ms)", raw["recall_search_scoped_ms"]["p50"]],
                    ["scoped answers equal", raw["recall_search_scoped_ms"]["answers_equal"]],
                    ["recall p50 (ms)", recall_ms["p50"]],
                    ["archive (blocks/s)", raw["archive"]["blocks_per_s"]],
                    ["resident memory / archived text", mem["rss_over_text"]],
                    ["restart with index snapshot (s)", raw["restart_s"]],
                    ["restart without snapshot (s)", raw["restart_cold_s"]],
                    [
                        "delete a conversation of 200 blocks (ms)",
                        raw["delete_conversation"]["request_ms"],
                    ],
                ],
                notes="Latencies end to end over NATS; the full scan reads, opens and scores "
                "every block as the original did.",
            ),
        ],
        targets=[
            _common.target("recall_search p50", search["p50"], "<=", 20, "ms", issue="3"),
            _common.target("recall_search p99", search["p99"], "<=", 100, "ms", issue="3"),
            _common.target("recall p50", recall_ms["p50"], "<=", 5, "ms", issue="3"),
            _common.target(
                "archive rate", raw["archive"]["blocks_per_s"], ">=", 500, "blocks/s", issue="3"
            ),
            _common.target("resident memory / text", mem["rss_over_text"], "<", 3, issue="3"),
            _common.target("restart (snapshot)", raw["restart_s"], "<=", 30, "s", issue="3"),
        ],
        data=raw,
        notes="The index only narrows candidates; every answer is checked against the exact "
        "rule, and the sampled answers are compared with the full scan.",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="5,000 blocks")
    args = parser.parse_args()
    n = args.blocks or (5_000 if args.quick else 100_000)
    out = ROOT / "results" / ("recall-quick.json" if args.quick else "recall.json")
    print(json.dumps(asyncio.run(measure(n, out)), indent=2))


if __name__ == "__main__":
    main()
