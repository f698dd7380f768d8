"""Gateway speed: what ``/v1`` adds over llama-server, and SSE fan-out.

Measured in the same run:

- **/v1 overhead** — the same streamed chat completions (same prompts, ``temperature 0``,
  ``ignore_eos``, fixed ``max_tokens``; each pair's prompt put in the engine's prompt cache
  first, so both requests of a pair find it there and the time to first token is one
  decoding step, not a noisy prefill) sent to llama-server directly and through ``/v1``
  (lease of kind ``foreign`` over NATS included), in alternating pairs. Figures: added time to
  first token (median of the per-pair differences; target ≤ 5 ms) and throughput ratio
  (median of per-pair tokens/s ratios over the decode phase; target ≥ 0.98). The engine
  is pinned to every core but one and the gateway, NATS and the client to that one, the way
  an engine on a GPU leaves the CPU to the gateway: with everything sharing every core, the
  comparison is one of CPU contention. The same comparison against the scripted fake engine
  (pinned with the engine) gives the gateway's cost without the model's noise.
- **SSE fan-out** — 100 concurrent ``GET /api/chat`` clients on one conversation while a turn
  of N events is published: every client must receive every event exactly once, in order;
  delivery latency (publish → client) percentiles alongside.

The lease and the chat events come from the fake peers of the gateway tests (a NATS
responder answering like the supervisor and the chat service), so the figures are the
gateway's own cost, not the other services'.

Usage: ``python bench/gateway_bench.py [--quick]`` (writes ``bench/results/gateway.json``),
or through the harness (``python -m bench --only gateway``), which calls :func:`run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
if str(ROOT.parent) not in sys.path:
    sys.path.insert(0, str(ROOT.parent))

import httpx

from bench import _common
from loki_shared import servers
from loki_shared.sse import SSEDecoder
from tests.fakes.fake_engine import FakeEngine, Stream, chunk
from tests.fakes.gateway_peers import FakePeers

TIMEOUT_S = {"quick": 600, "full": 1800}
PROMPTS = [
    "Write a short paragraph about the sea.",
    "List five fruits and say one thing about each.",
    "Explain what a prompt cache is, simply.",
    "Describe a walk in a forest in autumn.",
    "Tell a very short story about a robot and a cat.",
    "What makes a good cup of tea?",
]


def _start_gateway(nats_url: str, home: Path) -> tuple[servers.ManagedProcess, str]:
    port = servers.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOKI_")}
    env.update(
        LOKI_NATS_URL=nats_url,
        LOKI_WEB_PORT=str(port),
        LOKI_HOME=str(home),
        LOKI_SECRET_KEY="bench-secret",
        LOKI_LOG_LEVEL="WARNING",
        LOKI_REDIS_URL="redis://127.0.0.1:1/0",
    )  # no Redis: memory routes idle
    proc = servers.ManagedProcess(
        "gateway", [sys.executable, "-m", "loki_gateway"], env=env
    ).start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.stop()
    raise _common.BenchError("gateway did not start: " + " | ".join(proc.tail))


def _body(prompt: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {
        "model": "bench",
        "messages": [{"role": "user", "content": prompt}],
        "stream": stream,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }


def _warm(client: httpx.Client, url: str, prompt: str) -> None:
    """Put ``prompt`` in the engine's prompt cache (one token generated, not measured)."""
    r = client.post(url + "/v1/chat/completions", json=_body(prompt, 1, stream=False))
    if r.status_code != 200:
        raise _common.BenchError(f"{url}: status {r.status_code}: {r.text[:200]}")


def _one_stream(client: httpx.Client, url: str, prompt: str, max_tokens: int) -> dict[str, float]:
    """One streamed completion; returns ttft_s (first content delta), decode tokens/s."""
    body = _body(prompt, max_tokens)
    start = time.perf_counter()
    first = last = None
    n = 0
    decoder = SSEDecoder()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise _common.BenchError(f"{url}: status {r.status_code}: {r.read()[:200]!r}")
        for data in r.iter_bytes():
            for event in decoder.feed(data):
                choices = (event.chunk or {}).get("choices") or []
                if choices and choices[0].get("delta", {}).get("content"):
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    last = now
                    n += 1
    if first is None or last is None or n < 2:
        raise _common.BenchError(f"{url}: no content streamed")
    return {"ttft_s": first - start, "tps": (n - 1) / (last - first), "tokens": n}


def bench_v1_apart(
    engine_url: str, gateway_url: str, pairs: int, max_tokens: int
) -> dict[str, Any]:
    """:func:`bench_v1` in a process of its own: the client must not share an interpreter
    lock with the fake peers and the fake engine this process runs in threads (a thread
    switch costs up to ``sys.getswitchinterval()``, 5 ms, of noise on either side)."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        return pool.submit(bench_v1, engine_url, gateway_url, pairs, max_tokens).result()


def bench_v1(engine_url: str, gateway_url: str, pairs: int, max_tokens: int) -> dict[str, Any]:
    direct: list[dict[str, float]] = []
    via: list[dict[str, float]] = []
    retries: list[str] = []
    limits = httpx.Limits(keepalive_expiry=4.0)  # llama-server drops idle ones after 5 s
    with httpx.Client(timeout=300, limits=limits) as client:
        # warm both paths (model pages, connection pools)
        _one_stream(client, engine_url, PROMPTS[0], 8)
        _one_stream(client, gateway_url, PROMPTS[0], 8)
        for i in range(pairs):
            prompt = PROMPTS[i % len(PROMPTS)]
            _warm(client, engine_url, prompt)  # both requests of the pair find it cached
            order = [(engine_url, direct), (gateway_url, via)]
            if i % 2:
                order.reverse()  # alternate who goes first
            for url, sink in order:
                try:
                    sink.append(_one_stream(client, url, prompt, max_tokens))
                except httpx.RemoteProtocolError as exc:  # a dropped keep-alive: once more
                    retries.append(f"{'gateway' if url == gateway_url else 'engine'}: {exc}")
                    sink.append(_one_stream(client, url, prompt, max_tokens))
    added_ms = [(v["ttft_s"] - d["ttft_s"]) * 1000 for d, v in zip(direct, via)]
    tps = _common.paired_ratios([v["tps"] for v in via], [d["tps"] for d in direct])
    return {
        "pairs": pairs,
        "max_tokens": max_tokens,
        "added_ttft_ms": _common.spread(added_ms),
        "ttft_direct_ms": _common.spread([d["ttft_s"] * 1000 for d in direct]),
        "ttft_gateway_ms": _common.spread([v["ttft_s"] * 1000 for v in via]),
        "throughput": tps,
        "retried_requests": retries,
    }


async def _sse_client(
    url: str,
    cid: str,
    n_events: int,
    ready: asyncio.Event,
    counter: list[int],
    out: list[tuple[int, float]],
) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(300, connect=30)) as client:
        async with client.stream("GET", url + "/api/chat", params={"conversation": cid}) as r:
            if r.status_code != 200:
                raise _common.BenchError(f"SSE status {r.status_code}")
            counter[0] += 1
            if counter[0] == counter[1]:
                ready.set()
            decoder = SSEDecoder()
            async for raw in r.aiter_bytes():
                for event in decoder.feed(raw):
                    if event.chunk is None:
                        continue
                    data = event.chunk
                    out.append((data["seq"], time.time() - data["ts"]))
                    if data["seq"] >= n_events:
                        return


async def _fanout(url: str, peers: FakePeers, clients: int, n_events: int) -> dict[str, Any]:
    conv = peers.new_conv("fanout")
    cid = conv.info.id
    ready = asyncio.Event()
    counter = [0, clients]
    outs: list[list[tuple[int, float]]] = [[] for _ in range(clients)]
    tasks = [
        asyncio.create_task(_sse_client(url, cid, n_events, ready, counter, outs[i]))
        for i in range(clients)
    ]
    await asyncio.wait_for(ready.wait(), 120)
    await asyncio.sleep(1.0)
    started = time.perf_counter()

    async def publish() -> None:
        for i in range(n_events):
            await peers.emit(cid, {"content": f"tok{i} "})
            if i % 20 == 19:
                await asyncio.sleep(0.005)

    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(publish(), peers.loop))
    await asyncio.wait_for(asyncio.gather(*tasks), 300)
    elapsed = time.perf_counter() - started
    complete = [[seq for seq, _ in out] == list(range(1, n_events + 1)) for out in outs]
    latencies = [lat * 1000 for out in outs for _, lat in out]
    return {
        "clients": clients,
        "events": n_events,
        "all_received_every_event": all(complete),
        "clients_complete": sum(complete),
        "elapsed_s": elapsed,
        "latency_ms": {
            "p50": _common.percentile(latencies, 50),
            "p99": _common.percentile(latencies, 99),
            "max": max(latencies),
        },
    }


def run(quick: bool) -> dict:
    """Run both measurements; return the result document (see :mod:`bench._common`)."""
    pairs = 30 if quick else 100
    max_tokens = 32 if quick else 128
    n_events = 200 if quick else 1000
    # The engine (and the fake peers standing for the supervisor) on every core but one,
    # the gateway, NATS and the client on that one: as beside an engine computing on a GPU,
    # the gateway's work must not delay the engine's threads (llama.cpp's compute threads
    # spin; a core taken from one stalls them all), or the comparison measures CPU
    # contention, not what /v1 adds.
    cores = _common.split_cores()
    engine_cores, other_cores = cores if cores else (None, None)
    threads = len(engine_cores) if engine_cores else (os.cpu_count() or 2)
    with (
        tempfile.TemporaryDirectory(prefix="loki-gw-bench-") as tmp,
        contextlib.ExitStack() as stack,
        _common.pinned(other_cores),
    ):
        home = Path(tmp)
        nats_port = servers.free_port()
        nats_proc = servers.ManagedProcess(
            "nats", servers.nats_command(nats_port, home / "nats")
        ).start()
        stack.callback(nats_proc.stop)
        nats_proc.wait_port(nats_port)
        nats_url = f"nats://127.0.0.1:{nats_port}"
        with _common.pinned(engine_cores):
            engine = _common.start_llama(ctx=4096, parallel=1, threads=threads)
            stack.callback(engine.stop)
            peers = FakePeers(nats_url, engine.url, id_slot=0).start()
            stack.callback(peers.stop)
            # The same comparison against the scripted fake engine: no model time, so the
            # gateway's own cost is not buried in the model's noise.
            fake = stack.enter_context(FakeEngine())
        fake.default = Stream(
            frames=[chunk({"role": "assistant", "content": None})]
            + [chunk({"content": f" t{i}"}) for i in range(100)]
            + [chunk({}, "length")],
            delay_s=0.002,
        )
        gw_proc, gw_url = _start_gateway(nats_url, home / "gw")
        stack.callback(gw_proc.stop)
        build = _common.engine_build(engine.url)
        v1 = bench_v1_apart(engine.url, gw_url, pairs, max_tokens)
        peers.engine_url = fake.url
        v1_fake = bench_v1_apart(fake.url, gw_url, 40 if quick else 100, 100)
        peers.engine_url = engine.url
        fan = asyncio.run(_fanout(gw_url, peers, 100, n_events))
    added = v1["added_ttft_ms"]["median"]
    ratio = v1["throughput"]["ratio"]["median"]
    rows = [
        [
            "time to first token",
            f"{v1['ttft_gateway_ms']['median']:.1f} ms",
            f"{v1['ttft_direct_ms']['median']:.1f} ms",
            f"+{added:.2f} ms",
            f"{v1['added_ttft_ms']['q1']:.2f}–{v1['added_ttft_ms']['q3']:.2f} ms",
        ],
        [
            "decode throughput",
            f"{v1['throughput']['value']['median']:.1f} tok/s",
            f"{v1['throughput']['baseline']['median']:.1f} tok/s",
            f"×{ratio:.3f}",
            f"{v1['throughput']['ratio']['q1']:.3f}–{v1['throughput']['ratio']['q3']:.3f}",
        ],
    ]
    fadded = v1_fake["added_ttft_ms"]["median"]
    fratio = v1_fake["throughput"]["ratio"]["median"]
    rows += [
        [
            "time to first token (fake engine)",
            f"{v1_fake['ttft_gateway_ms']['median']:.2f} ms",
            f"{v1_fake['ttft_direct_ms']['median']:.2f} ms",
            f"+{fadded:.2f} ms",
            f"{v1_fake['added_ttft_ms']['q1']:.2f}–{v1_fake['added_ttft_ms']['q3']:.2f} ms",
        ],
        [
            "stream throughput (fake engine)",
            f"{v1_fake['throughput']['value']['median']:.1f} chunks/s",
            f"{v1_fake['throughput']['baseline']['median']:.1f} chunks/s",
            f"×{fratio:.3f}",
            f"{v1_fake['throughput']['ratio']['q1']:.3f}–{v1_fake['throughput']['ratio']['q3']:.3f}",
        ],
    ]
    fan_rows = [
        [
            fan["clients"],
            fan["events"],
            fan["clients_complete"],
            f"{fan['latency_ms']['p50']:.1f} ms",
            f"{fan['latency_ms']['p99']:.1f} ms",
            f"{fan['elapsed_s']:.2f} s",
        ]
    ]
    return _common.result(
        "Gateway: /v1 overhead and SSE fan-out",
        tables=[
            _common.table(
                "/v1 vs llama-server directly (same prompts, alternating pairs)",
                ["measure", "through /v1", "direct", "median difference", "IQR"],
                rows,
                notes=f"real engine: {pairs} pairs, {max_tokens} tokens each, "
                f"engine on {threads} core(s), gateway, NATS and client on "
                f"{len(other_cores) if other_cores else 'the same'} (pinned); "
                "fake engine: 100 chunks 2 ms apart, no model time",
            ),
            _common.table(
                "SSE fan-out on one conversation",
                [
                    "clients",
                    "events",
                    "clients with every event",
                    "latency p50",
                    "latency p99",
                    "turn delivered in",
                ],
                fan_rows,
            ),
        ],
        targets=[
            _common.target("added time to first token (median)", added, "<=", 5, "ms", issue="8"),
            _common.target(
                "throughput through /v1 vs direct (median ratio)", ratio, ">=", 0.98, issue="8"
            ),
            _common.target(
                "added time to first token, fake engine (median)", fadded, "<=", 5, "ms", issue="8"
            ),
            _common.target(
                "stream throughput through /v1 vs direct, fake engine",
                fratio,
                ">=",
                0.98,
                issue="8",
            ),
            _common.target(
                "SSE clients receiving every event", fan["clients_complete"], ">=", 100, issue="8"
            ),
        ],
        data={"v1": v1, "v1_fake_engine": v1_fake, "fanout": fan},
        engine=build,
    )


def main() -> None:
    _common.main_alone("gateway", run, __doc__.splitlines()[0], "fewer pairs and events")


if __name__ == "__main__":
    main()
