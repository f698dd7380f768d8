"""Real launches of llama-server by ``python -m loki_supervisor`` on CPU with the bundled
model: one slot, two slots (SIDE_SLOT), crash and restart, slot erase after a side job,
clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from loki_shared import servers, subjects
from loki_shared.messages.engine import (
    Lease,
    LeaseRequest,
    ReleaseReply,
    ReleaseRequest,
    RenewRequest,
)
from loki_shared.messages.health import HealthReply, HealthRequest

from .conftest import (
    blocked_signals,
    chat,
    collect_states,
    port_of,
    process_alive,
    request,
    wait_info,
)

pytestmark = pytest.mark.engine


def argv_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


async def lease(nc, kind: str, wait: float = 30.0, **kw) -> Lease:
    """A granted lease, claimed at once as :mod:`loki_shared.lease` does (a grant not
    renewed within ``LOKI_LEASE_CLAIM_S`` is given back). Its TTL is long (120 s unless
    ``ttl_s`` is given): these tests hold it through completions without renewing."""
    kw.setdefault("ttl_s", 120)
    reply = await request(
        nc,
        subjects.ENGINE_LEASE,
        LeaseRequest(kind=kind, wait_s=wait, **kw),
        Lease,
        timeout=wait + 5,
    )
    assert reply.error is None, reply.error
    claimed = await request(nc, subjects.ENGINE_RENEW, RenewRequest(lease_id=reply.lease_id), Lease)
    assert claimed.error is None, claimed.error
    return reply


async def release(nc, lease_id: str, **kw) -> ReleaseReply:
    return await request(
        nc,
        subjects.ENGINE_RELEASE,
        ReleaseRequest(lease_id=lease_id, **kw),
        ReleaseReply,
        timeout=10,
    )


async def test_one_slot_launch_lease_and_clean_stop(engine_env, supervisor_factory, nc):
    states: list[dict] = []
    await collect_states(nc, states)
    slots = Path(engine_env["LOKI_HOME"]) / "slots"
    slots.mkdir(parents=True)
    (slots / "stale.bin").write_bytes(b"old slot file")
    sup = supervisor_factory(engine_env)
    info = await wait_info(nc, lambda i: i.state == "ready", sup=sup)
    assert info.total_slots == 1 and info.slot_n_ctx == [2048] and info.n_ctx == 2048
    # --slot-save-path LOKI_HOME/slots: mode 0700, emptied at launch.
    assert argv_value(info.argv, "--slot-save-path") == str(slots.resolve())
    assert list(slots.iterdir()) == [] and (slots.stat().st_mode & 0o777) == 0o700
    assert not info.external and info.base_url.startswith("http://127.0.0.1:")
    argv = info.argv
    assert argv[argv.index("-c") + 1] == "2048" and argv[argv.index("-np") + 1] == "1"
    assert "--metrics" in argv and "--slot-save-path" in argv
    assert info.chat_template and info.model
    # the template was probed before "ready": SmolLM2's drops tools (tests/templates)
    template = info.template
    assert template is not None and template.error is None
    assert (template.supports_tools, template.stable_prefix) == (False, True)
    assert "recall is off" in " ".join(template.notes)
    assert "chat template" in sup.log()  # the verdicts are logged once
    assert [s["state"] for s in states][:2] == ["starting", "ready"]

    granted = await lease(nc, "main", conversation="c1")
    assert granted.id_slot is None and granted.base_url == info.base_url
    assert granted.n_ctx == 2048 and granted.shares_main_slot
    assert granted.template == template  # the verdicts travel with every lease
    # One slot: a second request waits; with a short wait it is refused as busy.
    busy = await request(
        nc, subjects.ENGINE_LEASE, LeaseRequest(kind="verify", wait_s=0.3), Lease, timeout=5
    )
    assert busy.error is not None and busy.error.type == "busy"
    body = await asyncio.to_thread(chat, granted.base_url, "Reply with one word: pong")
    assert body["choices"][0]["message"]["content"] is not None
    renewed = await request(
        nc, subjects.ENGINE_RENEW, RenewRequest(lease_id=granted.lease_id), Lease
    )
    assert renewed.lease_id == granted.lease_id
    assert (await release(nc, granted.lease_id)).ok
    again = await release(nc, granted.lease_id)
    assert again.error is not None and again.error.type == "not_found"

    engine_pids = sup.engine_pids()
    assert len(engine_pids) == 1
    port = port_of(info.base_url)
    assert sup.stop() == 0
    assert not servers.port_open("127.0.0.1", port)
    assert not process_alive(engine_pids[0])
    await asyncio.sleep(0.2)
    assert states[-1]["state"] == "stopped"


async def test_two_slots_with_side_slot(engine_env, supervisor_factory, nc):
    sup = supervisor_factory({**engine_env, "LOKI_SIDE_SLOT": "on"})
    info = await wait_info(nc, lambda i: i.state == "ready", sup=sup)
    argv = info.argv
    assert argv[argv.index("-c") + 1] == "4096"
    assert argv[argv.index("-np") + 1] == "2" and "--no-kv-unified" in argv
    assert info.side_slot and info.side_slot_refusal is None
    assert info.total_slots == 2 and info.slot_n_ctx == [2048, 2048] and info.n_ctx == 2048
    assert any("second slot uses" in n for n in info.notes)

    main = await lease(nc, "main", conversation="c1")
    # A second main request waits for slot 0; meanwhile a side request is served at once
    # (lease requests are handled concurrently: a waiting one never blocks another queue).
    waiting_main = asyncio.create_task(lease(nc, "main", conversation="c1", wait=60))
    await asyncio.sleep(0.3)
    side = await lease(nc, "verify", conversation="c1", wait=5)
    assert not waiting_main.done()
    assert (main.id_slot, side.id_slot) == (0, 1)
    assert main.shares_main_slot and not side.shares_main_slot
    foreign = await request(
        nc, subjects.ENGINE_LEASE, LeaseRequest(kind="foreign", wait_s=0.3), Lease, timeout=5
    )
    assert foreign.error is not None and foreign.error.type == "busy"
    # Both slots serve at once, each with its own window.
    r0, r1 = await asyncio.gather(
        asyncio.to_thread(chat, main.base_url, "Say hello.", 0),
        asyncio.to_thread(chat, side.base_url, "Say bye.", 1),
    )
    assert r0["choices"] and r1["choices"]
    await release(nc, main.lease_id)
    main2 = await asyncio.wait_for(waiting_main, 10)
    assert main2.id_slot == 0
    await release(nc, main2.lease_id)
    # Two slots: the slot erase abstains even at the end of a side job.
    rel = await release(nc, side.lease_id, job_done=True)
    assert rel.ok and not rel.slot_erased and "2 slots" in (rel.erase_skipped or "")


async def test_crash_is_restarted_with_backoff_and_leases_wait_for_it(
    engine_env, supervisor_factory, nc
):
    states: list[dict] = []
    await collect_states(nc, states)
    sup = supervisor_factory(engine_env)
    await wait_info(nc, lambda i: i.state == "ready", sup=sup)
    [pid] = sup.engine_pids()
    os.kill(pid, signal.SIGKILL)
    # A lease asked while the engine is down waits for the restarted engine.
    await wait_info(nc, lambda i: i.state != "ready", sup=sup, timeout=10)
    granted = await lease(nc, "main", wait=120)
    info = await wait_info(nc, lambda i: i.state == "ready" and i.restarts == 1, sup=sup)
    assert granted.base_url == info.base_url
    new_pids = sup.engine_pids()
    assert len(new_pids) == 1 and new_pids != [pid]
    assert blocked_signals(new_pids[0]) == 0, "the relaunched engine has signals blocked"
    names = [s["state"] for s in states]
    assert names[:2] == ["starting", "ready"]
    failed = [s for s in states if s["state"] == "failed"]
    assert failed and "status -9" in failed[0]["detail"] and "restart in 1 s" in failed[0]["detail"]
    assert failed[0]["stderr_tail"], "the last engine output lines are reported"
    assert names[names.index("failed") :][:3] == ["failed", "starting", "ready"]
    await asyncio.to_thread(chat, granted.base_url, "Hi")
    await release(nc, granted.lease_id)
    # A supervisor killed outright takes its engine with it (parent-death signal).
    sup.proc.kill()
    sup.proc.wait()
    deadline = time.monotonic() + 15
    while process_alive(new_pids[0]) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not process_alive(new_pids[0]), "orphan llama-server left running"


async def test_engine_that_cannot_start_is_failed_with_its_output(
    engine_env, supervisor_factory, nc, tmp_path
):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    states: list[dict] = []
    await collect_states(nc, states)
    sup = supervisor_factory({**engine_env, "LOKI_MODEL": str(bad)})
    info = await wait_info(nc, lambda i: i.state == "failed", sup=sup)
    # The engine's own reason, its last lines, and no retry: it would fail the same way.
    assert "while starting" in info.detail and "GGUF" in info.detail, info.detail
    assert info.stderr_tail and info.retry_in_s is None and "not retried" in info.detail
    failed = [s for s in states if s["state"] == "failed"]
    assert failed[0]["stderr_tail"] and failed[0]["retry_in_s"] is None
    await asyncio.sleep(3)  # a retry would have come after 1 s
    info = await wait_info(nc, lambda i: True, sup=sup)
    assert info.state == "failed" and info.restarts == 0
    assert [s["state"] for s in states].count("starting") == 1
    # The health check (compose) says so, with the reason, instead of flapping.
    health = await request(
        nc, subjects.health("engine-supervisor"), HealthRequest(), HealthReply, timeout=5
    )
    assert not health.ok and "GGUF" in health.detail["engine"], health
    # A lease is refused as unavailable, not hung.
    refused = await request(
        nc, subjects.ENGINE_LEASE, LeaseRequest(kind="main", wait_s=0.3), Lease, timeout=5
    )
    assert refused.error is not None and refused.error.type == "unavailable"
    t0 = time.monotonic()
    assert sup.stop() == 0 and time.monotonic() - t0 < 20


async def test_sigterm_with_a_frozen_engine_stops_within_the_budget(
    engine_env, supervisor_factory, nc
):
    """An engine that no longer reacts (SIGSTOP: it ignores SIGTERM until continued) is
    killed when the stop budget runs short; the supervisor exits 0 within it (issue 25)."""
    sup = supervisor_factory({**engine_env, "LOKI_STOP_TIMEOUT_S": "5"})
    await wait_info(nc, lambda i: i.state == "ready", sup=sup)
    [pid] = sup.engine_pids()
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    assert sup.stop(timeout=15) == 0, sup.log()[-3000:]
    assert time.monotonic() - t0 < 6, sup.log()[-3000:]
    deadline = time.monotonic() + 5
    while process_alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not process_alive(pid), "the frozen engine was left running"
    assert "could not stop the engine" in sup.log()


async def test_follows_an_engine_already_running(engine_env, supervisor_factory, nc, engine_url):
    sup = supervisor_factory({**engine_env, "LOKI_ENGINE_URL": engine_url})
    info = await wait_info(nc, lambda i: i.state == "ready", sup=sup)
    assert info.base_url == engine_url and info.total_slots == 1 and info.slot_n_ctx
    assert sup.engine_pids() == []  # nothing launched
    assert info.template is not None and info.template.supports_tools is False
    granted = await lease(nc, "main")
    assert granted.base_url == engine_url and granted.id_slot is None
    await release(nc, granted.lease_id)
    assert sup.stop() == 0
    assert servers.port_open("127.0.0.1", port_of(engine_url)), "a followed engine is not stopped"


LONG_SIDE_PROMPT = "Check this list of fruits and say if it is sorted: " + ", ".join(
    f"fruit number {i}" for i in range(36)
)


async def test_slot_erase_after_a_side_job(engine_env, supervisor_factory, nc):
    sup = supervisor_factory(engine_env)
    info = await wait_info(nc, lambda i: i.state == "ready", sup=sup)
    assert info.build_number is not None and info.build_number >= 8660
    main = await lease(nc, "main", conversation="c1")
    await asyncio.to_thread(chat, main.base_url, "Tell me about the sea.")
    await release(nc, main.lease_id)

    # Control: without an erase, the side prompt sent twice is served from the slot.
    side = await lease(nc, "verify", conversation="c1")
    await asyncio.to_thread(chat, side.base_url, LONG_SIDE_PROMPT)
    again = await asyncio.to_thread(chat, side.base_url, LONG_SIDE_PROMPT)
    prompt_n = again["timings"]["prompt_n"] + again["timings"]["cache_n"]
    assert again["timings"]["cache_n"] > prompt_n // 2
    rel = await release(nc, side.lease_id, job_done=True)
    assert rel.ok and rel.slot_erased, rel.erase_skipped

    # The slot no longer holds the side job: the same prompt is mostly recomputed.
    probe = await lease(nc, "verify", conversation="c1")
    after = await asyncio.to_thread(chat, probe.base_url, LONG_SIDE_PROMPT)
    assert after["timings"]["cache_n"] < prompt_n // 2
    # Not the end of the job, or a compaction: no erase.
    rel = await release(nc, probe.lease_id, job_done=False)
    assert not rel.slot_erased
    comp = await lease(nc, "compact", conversation="c1")
    rel = await release(nc, comp.lease_id, job_done=True)
    assert not rel.slot_erased and "compaction" in (rel.erase_skipped or "")


async def test_parallel_two_without_side_slot_has_no_id_slot_and_a_smaller_window(
    engine_env, supervisor_factory, nc
):
    sup = supervisor_factory({**engine_env, "LOKI_PARALLEL": "2"})
    info = await wait_info(nc, lambda i: i.state == "ready", sup=sup)
    # PARALLEL=2 without SIDE_SLOT: two slots of CTX/2 → no id_slot, two leases at once.
    assert info.total_slots == 2 and info.slot_n_ctx == [1024, 1024] and info.n_ctx == 1024
    a = await lease(nc, "verify")
    b = await lease(nc, "main", wait=5)
    assert a.id_slot is None and b.id_slot is None
    rel = await release(nc, a.lease_id, job_done=True)
    assert not rel.slot_erased and "2 slots" in (rel.erase_skipped or "")
    await release(nc, b.lease_id)


async def test_chat_template_file_gives_gemma_its_turn_template(engine_env, supervisor_factory, nc):
    """Issue 16: Gemma 3 270M's GGUF has no chat template; ``LOKI_CHAT_TEMPLATE_FILE``
    (Loki's Gemma-turn template of the template tests) is passed with ``--jinja``, and the
    probe at ready sees what that template does (strict alternation, no tools)."""
    from tests.templates.models import GEMMA_TEMPLATE, gemma_model

    env = {
        **engine_env,
        "LOKI_MODEL": str(gemma_model()),
        "LOKI_CHAT_TEMPLATE_FILE": str(GEMMA_TEMPLATE),
    }
    sup = supervisor_factory(env)
    info = await wait_info(nc, lambda i: i.state == "ready", sup=sup)
    i = info.argv.index("--chat-template-file")
    assert info.argv[i - 1 : i + 2] == ["--jinja", "--chat-template-file", str(GEMMA_TEMPLATE)]
    assert "<start_of_turn>" in (info.chat_template or "")
    template = info.template
    assert template is not None and template.error is None
    assert (template.supports_tools, template.strict_alternation) == (False, True)
    assert "refuses two user messages" in " ".join(template.notes)
