"""The JSON-route fuzz (issue 38) on the gateway with the fake peers and the scripted fake
engine: every JSON route under ``/api/chat``, ``/api/conversations`` and ``/v1`` (the
operations the fake peers serve; the whole stack's routes are fuzzed in
``tests/e2e/test_fuzz_inputs.py``) gets bodies whose strings are non-BMP text, lone
surrogates, NUL, control characters or huge: no answer is a 5xx."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes.fake_engine import FakeEngine, responses_reply, text_reply
from tests.fakes.gateway_peers import FakePeers

from .code_peers import CodePeers
from .fuzz_json import run_fuzz

KEY = "fuzz-text-key"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    with FakeEngine() as fake:
        fake.embeddings = True
        # a Responses body (``input``) gets a Responses stream, any other the default reply
        fake.responder = lambda body: (
            responses_reply() if "input" in body and "messages" not in body else text_reply()
        )
        yield fake


@pytest.fixture(scope="module")
def peers(gw_nats, engine, tmp_path_factory):
    fake = FakePeers(gw_nats, engine.url, id_slot=0)
    fake.delay_s = 0
    fake.start()
    # code mode's peers too (loki.chat.code, loki.workspace.*: issue 43's /api/chat routes)
    code = CodePeers(fake, tmp_path_factory.mktemp("fuzz-workspaces")).start()
    yield fake
    code.stop()
    fake.stop()


def test_no_json_route_answers_5xx_to_the_worlds_text(gateway_factory, peers):
    gw = gateway_factory(key=KEY)
    conv = peers.new_conv("fuzz")
    with httpx.Client(base_url=gw.url, headers=gw.headers(), timeout=60) as client:
        spec = client.get("/openapi.json").json()
        sent, failures = run_fuzz(
            client,
            spec,
            {"conversation": conv.info.id},
            examples=12,
            prefix=r"^/(api/chat|api/conversations|v1)",
        )
    assert sent >= 100
    assert not failures, "\n".join(failures[:20]) + "\n--- gateway ---\n" + gw.logs()[-3000:]
