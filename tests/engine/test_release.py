"""The supervisor's release rules without an engine process: the CACHE_RAM advice (once,
only after a side job shared the conversation's slot) and the erase verdicts reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from loki_shared.messages.engine import LeaseRequest, ReleaseRequest
from loki_shared.sealing import Sealer
from loki_supervisor.engine_process import Props
from loki_supervisor.errors import NotFound
from loki_supervisor.service import Supervisor
from loki_supervisor.settings import Settings


async def _noop(_event) -> None:
    return None


@pytest.fixture
async def sup(tmp_path: Path):
    settings = Settings(home=tmp_path, ctx=2048, engine_port=1)
    s = Supervisor(settings, redis=None, sealer=Sealer(b"k" * 32), publish_state=_noop)
    s.runner.state = "ready"
    s.runner.base_url = "http://127.0.0.1:1"
    s.runner.props = Props(total_slots=1, slot_n_ctx=[2048], build_info="b9000-x", model="m")
    yield s
    await s.runner._client.aclose()


async def cycle(sup, kind, conversation="c1", **release_kw):
    lease = await sup.lease(LeaseRequest(kind=kind, conversation=conversation, wait_s=1))
    return lease, await sup.release(ReleaseRequest(lease_id=lease.lease_id, **release_kw))


async def test_cache_ram_advice_once_after_a_side_job_on_the_shared_slot(sup):
    _, first = await cycle(sup, "main", prompt_tokens=1000, cached_tokens=0)
    assert first.advice is None  # nothing ran in between: a cold start is no advice
    await cycle(sup, "main", prompt_tokens=1200, cached_tokens=100)
    assert (await cycle(sup, "main", prompt_tokens=1200, cached_tokens=100))[1].advice is None
    side, _ = await cycle(sup, "verify")
    assert side.shares_main_slot
    _, rel = await cycle(sup, "main", prompt_tokens=1300, cached_tokens=600)
    assert rel.advice and "CACHE_RAM" in rel.advice and "600 of 1300" in rel.advice
    assert rel.advice in sup.info().notes
    await cycle(sup, "subagent")
    _, again = await cycle(sup, "main", prompt_tokens=1400, cached_tokens=10)
    assert again.advice is None  # once


async def test_no_advice_when_the_cache_came_back(sup):
    await cycle(sup, "main", prompt_tokens=1000, cached_tokens=0)
    await cycle(sup, "task")
    _, rel = await cycle(sup, "main", prompt_tokens=1100, cached_tokens=990)
    assert rel.advice is None


async def test_no_advice_with_two_slots(sup):
    sup.runner.props = Props(total_slots=2, slot_n_ctx=[2048, 2048], build_info="b9000-x")
    await cycle(sup, "main", prompt_tokens=1000, cached_tokens=0)
    side, _ = await cycle(sup, "verify")
    assert side.id_slot == 1 and not side.shares_main_slot
    _, rel = await cycle(sup, "main", prompt_tokens=1100, cached_tokens=0)
    assert rel.advice is None


async def test_release_reports_why_the_erase_abstained(sup):
    _, rel = await cycle(sup, "compact", job_done=True)
    assert not rel.slot_erased and "compaction" in rel.erase_skipped
    sup.preset.features["CACHE_ISOLATE"] = "off"
    _, rel = await cycle(sup, "verify", job_done=True)
    assert "CACHE_ISOLATE off" in rel.erase_skipped
    sup.preset.features["CACHE_ISOLATE"] = "on"
    sup.runner.props.build_info = "b0-unknown"
    _, rel = await cycle(sup, "verify", job_done=True)
    assert "build unknown" in rel.erase_skipped
    sup.runner.props.build_info = "b9000-x"
    # The engine does not answer /slots here: slot 0's state is unknown → abstain.
    _, rel = await cycle(sup, "bench", job_done=True)
    assert rel.erase_skipped == "slot 0 state unknown"
    _, rel = await cycle(sup, "verify", job_done=False)
    assert rel.erase_skipped is None and not rel.slot_erased
    with pytest.raises(NotFound):
        await sup.release(ReleaseRequest(lease_id="nope"))
