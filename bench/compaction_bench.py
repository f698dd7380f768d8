"""Compaction on the real engine (issue 5).

A scripted conversation (40 turns; 16 in quick mode) with pasted blocks runs through the chat
service (in-process, default compaction policy) on the real llama-server with the bundled
model and a small window, twice in the same run: ``COMPACT_CONTINUATION`` off (transcript
path) and on. Real NATS, Redis and recall service; a minimal lease responder stands in for the
engine supervisor (one slot, ``id_slot`` 0). Every request the engine serves goes through
:class:`bench._common.RecordingProxy`, which keeps its body and ``timings``.

Figures: compactions per run and turns that ended in an error (must be 0); an archived block
brought back with ``recall(id)`` and compared byte for byte with what was pasted; the summary
requests' ``prompt_n`` (tokens the engine prefilled) of each run. In the conversation runs the
continuation's fit rule rarely holds (each turn adds ~300 tokens past the 75% threshold of a
small window), so the ratio is measured by a probe (:func:`_ratio_probe`) in the same run:
one ~2,600-token conversation compacted by both paths on a 4096 window, target ≤ 10%.

The window is 2560 tokens: at the 75% threshold a continuation needs the demand and the
summary budget to fit in what is left (``(ctx_used + demand + budget) × 1.05 ≤ n_ctx``),
which 2048 leaves no room for.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import _common

TIMEOUT_S = {"quick": 3000, "full": 9000}

N_CTX = 2560
#: The continuation demand's first words (how its requests are told apart).
DEMAND_MARK = "[Loki — compaction]"
SECRET = "bench-secret-key-0123456789"
MODEL = "smollm2"


def pasted(i: int) -> str:
    """A pasted block (1,000–1,400 characters, so archived): code, a log or notes."""
    kind = i % 3
    if kind == 0:
        lines = [f"# file module_{i}.py"] + [
            f"def step_{i}_{k}(x):\n    return x * {k + i} + {k * 3 % 7}" for k in range(24)
        ]
    elif kind == 1:
        lines = [f"== build log run {i} =="] + [
            f"[{10 + k:02d}:{(k * 7) % 60:02d}] unit_{i}_{k}.c ok ({k * 13 % 97} ms)"
            for k in range(32)
        ]
    else:
        lines = [f"Meeting notes {i}"] + [
            f"- item {k}: team {chr(65 + k % 26)} owns task {i * 100 + k}" for k in range(36)
        ]
    return "\n".join(lines)


def note(i: int) -> str:
    """A chatty message under 800 characters (kept whole in a transcript)."""
    parts = [f"Requirement set {i}:"]
    for k in range(6):
        parts.append(
            f"the {['parser', 'cache', 'UI', 'CLI', 'API', 'tests'][k]} must handle "
            f"case {i * 10 + k} with a limit of {(i + 1) * (k + 2)} items and report "
            f"errors in plain words."
        )
    return " ".join(parts)[:700] + " Reply in one short sentence."


def script(turns: int) -> list[str]:
    """The user messages: a pasted block, then a requirements note, alternately."""
    out = []
    for t in range(turns):
        if t % 2 == 0:
            out.append(f"Please keep this for later (paste {t}):\n{pasted(t)}")
        else:
            out.append(note(t))
    return out


async def _lease_responder(nc: Any, base_url: str, n_ctx: int = N_CTX) -> list[Any]:
    from loki_shared import subjects
    from loki_shared.messages.engine import EngineInfo, Lease, LeaseRequest, ReleaseReply

    count = 0

    async def lease(msg: Any) -> None:
        nonlocal count
        count += 1
        req = LeaseRequest.model_validate_json(msg.data)
        reply = Lease(
            lease_id=f"b{count}",
            kind=req.kind,
            base_url=base_url,
            id_slot=0,
            n_ctx=n_ctx,
            model=MODEL,
        )
        await msg.respond(reply.model_dump_json().encode())

    async def release(msg: Any) -> None:
        await msg.respond(ReleaseReply(ok=True).model_dump_json().encode())

    async def info(msg: Any) -> None:
        await msg.respond(
            EngineInfo(state="ready", base_url=base_url, n_ctx=n_ctx, total_slots=1, model=MODEL)
            .model_dump_json()
            .encode()
        )

    subs = [
        await nc.subscribe(subjects.ENGINE_LEASE, cb=lease),
        await nc.subscribe(subjects.ENGINE_RELEASE, cb=release),
        await nc.subscribe(subjects.ENGINE_INFO, cb=info),
    ]
    await nc.flush()
    return subs


async def _conversation(
    nats_url: str, redis_url: str, home: Path, proxy: Any, continuation: bool, turns: int
) -> dict[str, Any]:
    """One run of the scripted conversation; returns its figures."""
    import httpx
    import nats
    import redis.asyncio as aioredis

    from loki_chat.service import ChatService, instance_id
    from loki_chat.settings import Settings
    from loki_chat.store import Store
    from loki_chat.tools import ToolBox
    from loki_shared import subjects
    from loki_shared.messages.chat import ChatEvent, SendReply, SendRequest
    from loki_shared.messages.recall import ToolReply, ToolRequest
    from loki_shared.nats import make_broker
    from loki_shared.sealing import service_sealer

    settings = Settings(
        home=home,
        nats_url=nats_url,
        redis_url=redis_url,
        secret_key=SECRET,
        max_tokens=16,
        temperature=0.7,
        step_budget=1,
        compact_continuation=continuation,
        lease_timeout_s=120.0,
    )
    nc = await nats.connect(nats_url)
    from loki_shared.perf_publish import ensure_perf_stream

    await ensure_perf_stream(nc.jetstream())  # the perf service's stream, as in the stack
    subs = await _lease_responder(nc, proxy.url)
    events: list[ChatEvent] = []
    ended = asyncio.Event()

    async def on_event(msg: Any) -> None:
        event = ChatEvent.model_validate_json(msg.data)
        events.append(event)
        if (event.loki or {}).get("event") == "turn_end":
            ended.set()

    await nc.subscribe(subjects.CHAT_EVENTS_ALL, cb=on_event)
    redis_client = aioredis.Redis.from_url(redis_url)
    store = Store(redis_client, service_sealer(home, SECRET), instance_id(settings), 15.0)
    broker = make_broker(nats_url, "chat-bench")
    http = httpx.AsyncClient()
    service = ChatService(settings, broker, store, http)
    service.toolbox = ToolBox()  # no tool: one step per turn (the machine is small)
    service.register()
    await broker.start()
    await service.start()
    first_exchange = len(proxy.exchanges)
    cid = None
    errors: list[str] = []
    pasted_text: dict[int, str] = {}
    t0 = time.monotonic()
    try:
        for t, text in enumerate(script(turns)):
            if text.startswith("Please keep"):
                pasted_text[t] = text
            ended.clear()
            raw = await nc.request(
                subjects.CHAT_SEND,
                SendRequest(conversation=cid, content=text).model_dump_json().encode(),
                timeout=30,
            )
            cid = SendReply.model_validate_json(raw.data).conversation
            await asyncio.wait_for(ended.wait(), 900)
            end = [e for e in events if (e.loki or {}).get("event") == "turn_end"][-1]
            if end.finish_reason == "error":
                errors.append(f"turn {t}: {end.loki.get('error')}")
        marks = [e.loki for e in events if (e.loki or {}).get("event") == "compaction"]
        # an archived pasted block comes back verbatim
        recalled = None
        archived = [i for m in marks for i in m.get("archived", [])]
        if archived:
            msg = await broker.request(
                ToolRequest(name="recall", arguments={"id": archived[0]}),
                subjects.RECALL_TOOL,
                timeout=10,
            )
            text = ToolReply.model_validate_json(msg.body).text
            body = text.split("\n", 1)[1] if "\n" in text else ""
            recalled = {
                "id": archived[0],
                "verbatim": body in pasted_text.values(),
                "chars": len(body),
            }
    finally:
        await service.close()
        await broker.stop()
        await redis_client.aclose()
        await http.aclose()
        for sub in subs:
            await sub.unsubscribe()
        await nc.close()
    summaries = [x for x in proxy.exchanges[first_exchange:] if x.body.get("stream") is False]
    return {
        "continuation": continuation,
        "turns": turns,
        "seconds": round(time.monotonic() - t0, 1),
        "compactions": len(marks),
        "paths": [m.get("path") for m in marks],
        "triggers": [m.get("trigger") for m in marks],
        "errors": errors,
        "recalled": recalled,
        "summary_requests": [
            {
                "continuation": DEMAND_MARK
                in json.dumps(x.body["messages"][-1], ensure_ascii=False),
                "prompt_n": x.prompt_n,
                "cache_n": x.cache_n,
                "status": x.status,
            }
            for x in summaries
        ],
    }


PROBE_CTX = 4096


async def _ratio_probe(nats_url: str, home: Path) -> dict[str, Any]:
    """The summary request's ``prompt_n`` on both paths, same engine, same conversation.

    A conversation of requirement notes (under 800 characters each, so nothing is archived
    and the transcript carries them whole) of about 2,600 tokens is sent once as a real turn
    step (the slot then holds it); a copy is compacted with the key off (the transcript path,
    first: the engine has not seen its prompt), then another with ``COMPACT_CONTINUATION`` on
    (after its own turn step). Transcript first, because a continuation summary the model
    loops in falls back to the transcript request, which would then be cached for the key-off
    run (``prompt_n`` 1). The threshold is lowered to 50% for the probe only, so the
    continuation fits the window with its demand and budget.
    """
    import httpx
    import nats

    from loki_chat.bus import ChatBus
    from loki_chat.compaction import CompactionDeps, CompactionPolicy
    from loki_chat.context import ContextView
    from loki_chat.conversation import Conversation
    from loki_chat.request import build_payload, encode, wire_messages
    from loki_chat.settings import Settings
    from loki_shared.messages.chat import ChatMessage
    from loki_shared.messages.engine import Lease
    from loki_shared.nats import make_broker

    with _common.llama(ctx=PROBE_CTX) as engine:
        proxy = _common.RecordingProxy(engine.url).start()
        nc = await nats.connect(nats_url)
        subs = await _lease_responder(nc, proxy.url, PROBE_CTX)
        broker = make_broker(nats_url, "probe")
        await broker.start()
        http = httpx.AsyncClient()
        try:
            conv = Conversation(id="probe")
            for i in range(16):
                conv.messages += [
                    ChatMessage(role="user", content=note(i)),
                    ChatMessage(role="assistant", content=f"Noted set {i}."),
                ]
            conv.messages.append(ChatMessage(role="user", content="Which set limits the CLI most?"))
            out: dict[str, Any] = {}
            for continuation in (False, True):
                settings = Settings(
                    home=home,
                    nats_url=nats_url,
                    secret_key=SECRET,
                    max_tokens=8,
                    compact_continuation=continuation,
                    compact_threshold=0.5,
                )
                policy = CompactionPolicy(CompactionDeps(settings, ChatBus(broker), http))
                work = Conversation(
                    id=f"probe-{int(continuation)}",
                    messages=[m.model_copy() for m in conv.messages],
                )
                lease = Lease(model=MODEL, n_ctx=PROBE_CTX, base_url=proxy.url, id_slot=0)
                body = encode(
                    build_payload(
                        settings, lease, wire_messages(settings.system_prompt, work.messages), None
                    )
                )
                resp = await http.post(
                    proxy.url + "/v1/chat/completions",
                    content=body.replace(b'"stream":true', b'"stream":false'),
                    headers={"Content-Type": "application/json"},
                    timeout=900,
                )
                data = resp.json()
                usage = data["usage"]
                # the turn's request as sent (streamed in the chat; the prompt is the same)
                policy.note_step(work.id, lease, body, usage, len(work.messages))
                work.messages.append(
                    ChatMessage(
                        role="assistant", content=data["choices"][0]["message"]["content"] or "…"
                    )
                )
                used = usage["prompt_tokens"] + usage["completion_tokens"]
                marks: list[dict[str, Any]] = []

                async def emit(delta: dict[str, Any], loki: dict[str, Any] | None) -> None:
                    marks.append(loki or {})

                view = ContextView(
                    conversation=work,
                    trigger="end",
                    n_ctx=PROBE_CTX,
                    ctx_used=used,
                    emit=emit,
                )
                changed = await policy.maybe_compact(view)
                out["continuation" if continuation else "transcript"] = {
                    "conversation_prompt_tokens": usage["prompt_tokens"],
                    "changed": changed,
                    "path": marks[-1].get("path") if marks else None,
                    "failure": marks[-1].get("failure") if marks else None,
                    "prompt_n": (
                        policy.continuation_prompt_n[0]
                        if continuation and policy.continuation_prompt_n
                        else policy.summaries.last_prompt_n
                    ),
                }
            cont = out["continuation"]["prompt_n"]
            trans = out["transcript"]["prompt_n"]
            out["ratio"] = cont / trans if cont and trans else None
            out["engine"] = _common.engine_build(engine.url)
            return out
        finally:
            await http.aclose()
            await broker.stop()
            for sub in subs:
                await sub.unsubscribe()
            await nc.close()
            proxy.stop()


async def _run(quick: bool) -> dict[str, Any]:
    from loki_recall.service import RecallService
    from loki_recall.settings import Settings as RecallSettings
    from loki_shared import servers

    turns = 12 if quick else 40
    root = Path(tempfile.mkdtemp(prefix="loki-bench-compaction-"))
    nats_port, redis_port = servers.free_port(), servers.free_port()
    (root / "nats").mkdir()
    (root / "redis").mkdir()
    nats_proc = servers.ManagedProcess("nats", servers.nats_command(nats_port, root / "nats"))
    redis_proc = servers.ManagedProcess("redis", servers.redis_command(redis_port, root / "redis"))
    nats_proc.start()
    redis_proc.start()
    nats_proc.wait_port(nats_port)
    redis_proc.wait_port(redis_port)
    nats_url, redis_url = f"nats://127.0.0.1:{nats_port}", f"redis://127.0.0.1:{redis_port}/0"
    recall = RecallService(
        RecallSettings(
            nats_url=nats_url, redis_url=redis_url, home=root / "recall", secret_key=SECRET
        )
    )
    await recall.start()
    try:
        with _common.llama(ctx=N_CTX) as engine:
            proxy = _common.RecordingProxy(engine.url).start()
            try:
                runs = []
                for continuation in (False, True):
                    runs.append(
                        await _conversation(
                            nats_url,
                            redis_url,
                            root / f"home-{int(continuation)}",
                            proxy,
                            continuation,
                            turns,
                        )
                    )
                build = _common.engine_build(engine.url)
            finally:
                proxy.stop()
        probe = await _ratio_probe(nats_url, root / "probe")
    finally:
        await recall.stop()
        nats_proc.stop()
        redis_proc.stop()
    return {"runs": runs, "probe": probe, "engine": build}


def run(quick: bool) -> dict[str, Any]:
    out = asyncio.run(_run(quick))
    runs = out["runs"]
    off, on = runs
    transcript_n = [
        s["prompt_n"]
        for s in off["summary_requests"]
        if not s["continuation"] and isinstance(s["prompt_n"], int)
    ]
    cont_n = [
        s["prompt_n"]
        for s in on["summary_requests"]
        if s["continuation"] and s["status"] == 200 and isinstance(s["prompt_n"], int)
    ]
    median_ratio = (
        statistics.median(cont_n) / statistics.median(transcript_n)
        if cont_n and transcript_n
        else None
    )
    ratio = out["probe"].get("ratio")
    rows = []
    for r in runs:
        ns = [s["prompt_n"] for s in r["summary_requests"] if isinstance(s["prompt_n"], int)]
        rows.append(
            [
                "on" if r["continuation"] else "off",
                r["turns"],
                r["compactions"],
                ", ".join(f"{t}/{p}" for t, p in zip(r["triggers"], r["paths"])) or "-",
                len(r["errors"]),
                ns and statistics.median(ns),
                "yes" if (r["recalled"] or {}).get("verbatim") else "no",
                r["seconds"],
            ]
        )
    recalled_ok = all((r["recalled"] or {}).get("verbatim") for r in runs)
    targets = [
        _common.target(
            "compactions without error (off run)",
            off["compactions"] if not off["errors"] else 0,
            ">=",
            2,
            issue="5",
        ),
        _common.target(
            "compactions without error (on run)",
            on["compactions"] if not on["errors"] else 0,
            ">=",
            2,
            issue="5",
        ),
        _common.target(
            "archived block recalled verbatim (both runs)",
            1 if recalled_ok else 0,
            ">=",
            1,
            issue="5",
        ),
        _common.target(
            "summary prompt_n, continuation / transcript (probe)", ratio, "<=", 0.10, issue="5"
        ),
    ]
    return _common.result(
        f"Compaction on the real engine (window {N_CTX}, bundled model)",
        tables=[
            _common.table(
                "Scripted conversation, COMPACT_CONTINUATION off and on (same run)",
                [
                    "COMPACT_CONTINUATION",
                    "turns",
                    "compactions",
                    "trigger/path",
                    "errors",
                    "median summary prompt_n",
                    "recall verbatim",
                    "s",
                ],
                rows,
                notes=(
                    "prompt_n: tokens the engine prefilled for each summary request "
                    f"(transcript {transcript_n}, continuation {cont_n})."
                ),
            )
        ],
        targets=targets,
        data={**out, "ratio": ratio, "median_ratio": median_ratio},
        notes=__doc__.split("\n\n")[1].replace("\n", " "),
        engine=out["engine"],
    )


def main() -> None:
    import sys

    quick = "--quick" in sys.argv
    document = run(quick)
    path = _common.write_result("compaction", document)
    print(json.dumps({"targets": document["targets"], "tables": document["tables"]}, indent=1))
    print(path)


if __name__ == "__main__":
    main()
