"""Speculative decoding with a draft model, for real: the bundled model as its own draft
(the same vocabulary) is passed to llama-server under the spellings its ``--help`` lists, and
completions carry ``timings.draft_n`` / ``draft_n_accepted``. A draft of another vocabulary
(a GGUF header written here) is refused before anything is launched."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from loki_shared import servers
from loki_supervisor.facts import read_vocab
from loki_supervisor.plan import LocalConfig, plan_launch
from loki_supervisor.service import collect_facts

from .conftest import wait_info

DRAFT_ENV = {"LOKI_DRAFT_MAX": "6", "LOKI_DRAFT_MIN": "1"}


def write_other_vocab(path: Path) -> Path:
    """A GGUF header whose vocabulary is the bundled model's with one token changed."""
    import gguf

    vocab = read_vocab(servers.find_bundled_model())
    tokens = list(vocab["tokenizer.ggml.tokens"])
    tokens[1000] = "not-the-same-token"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(str(vocab["tokenizer.ggml.model"]))
    w.add_token_list(tokens)
    w.add_bos_token_id(int(vocab["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(vocab["tokenizer.ggml.eos_token_id"]))
    w.add_add_bos_token(bool(vocab.get("tokenizer.ggml.add_bos_token")))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def test_a_draft_of_another_vocabulary_is_refused_with_the_token(tmp_path: Path):
    from loki_supervisor.draft import DraftRequest

    model = servers.find_bundled_model()
    other = write_other_vocab(tmp_path / "other.gguf")
    facts = collect_facts(model, servers.find_llama_server(), other)
    plan = plan_launch(
        LocalConfig(model=model, ctx=2048, draft=DraftRequest(model=str(other))), facts
    )
    assert plan.draft.refusal is not None
    assert plan.draft.refusal.startswith("vocabularies differ: token 1000 is ")
    assert str(other) not in plan.args
    assert any(n.startswith("draft model refused: vocabularies differ") for n in plan.notes)
    # the bundled model as its own draft is accepted by the same rules
    same = plan_launch(
        LocalConfig(model=model, ctx=2048, draft=DraftRequest(model=str(model))),
        collect_facts(model, servers.find_llama_server(), model),
    )
    assert same.draft.on and same.draft.refusal is None


@pytest.mark.engine
async def test_the_bundled_model_drafts_for_itself(engine_env, supervisor_factory, nc):
    model = str(servers.find_bundled_model())
    env = {**engine_env, "LOKI_DRAFT_MODEL": model, **DRAFT_ENV}
    sup = supervisor_factory(env)
    info = await wait_info(nc, lambda i: i.state == "ready", timeout=180, sup=sup)
    assert info.draft_model == model and info.draft_refusal is None
    argv = info.argv
    flag = next(f for f in ("--spec-draft-model", "--model-draft", "-md") if f in argv)
    assert argv[argv.index(flag) + 1] == model
    assert any("draft model" in n for n in info.notes)
    async with httpx.AsyncClient(timeout=300) as client:
        r = await client.post(
            f"{info.base_url}/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "Count from 1 to 30."}],
                "max_tokens": 48,
                "temperature": 0,
            },
        )
    r.raise_for_status()
    timings = r.json()["timings"]
    # the model drafting for itself at temperature 0: drafts are made and accepted
    assert timings.get("draft_n", 0) > 0, timings
    assert 0 < timings.get("draft_n_accepted", 0) <= timings["draft_n"], timings


def metric_sum(text: str, name: str) -> float:
    """Sum of every sample of ``name`` in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.engine
@pytest.mark.slow
def test_drafts_flow_to_perf_records_summary_and_prometheus(tmp_path: Path):
    """The whole stack with the bundled model as its own draft: a turn's perf record carries
    ``draft_n``/``draft_n_accepted``, ``/api/perf/summary`` ``detail.draft`` sums them, and the
    perf service's Prometheus counters (the dashboard's draft-acceptance panel reads them)
    count them."""
    import time

    from loki_cli.stack import Stack, StackConfig
    from tests.e2e.conftest import StackClient

    metrics_port = servers.free_port()
    env = {
        "LOKI_CTX": "2048",
        "LOKI_DRAFT_MODEL": str(servers.find_bundled_model()),
        **DRAFT_ENV,
        "LOKI_PERF_METRICS_PORT": str(metrics_port),
        "LOKI_MAX_TOKENS": "64",
    }
    stack = Stack(StackConfig(home=tmp_path, web_port=servers.free_port(), env=env, echo=False))
    stack.start()
    try:
        info = stack.wait_engine_ready(timeout=240)
        assert info["draft_model"] == env["LOKI_DRAFT_MODEL"], info
        client = StackClient(f"http://127.0.0.1:{stack.config.web_port}")
        conv = client.send("Count from 1 to 30, separated by commas.")
        client.events(conv)
        client.wait_idle(conv)
        deadline = time.monotonic() + 30
        draft: dict = {}
        while time.monotonic() < deadline:
            draft = client.http.get("/api/perf/summary").json()["detail"]["draft"]
            if draft["draft_n"]:
                break
            time.sleep(0.5)
        assert draft["draft_n"] > 0, draft
        assert 0 < draft["draft_n_accepted"] <= draft["draft_n"], draft
        assert 0 < draft["acceptance"] <= 1, draft
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        assert metric_sum(text, "lokiassist_draft_tokens_total") >= draft["draft_n"]
        assert (
            metric_sum(text, "lokiassist_draft_tokens_accepted_total")
            >= (draft["draft_n_accepted"])
        )
    finally:
        stack.stop()
