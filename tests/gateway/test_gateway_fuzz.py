"""Schema-driven fuzzing of the gateway's OpenAPI with schemathesis: no request, however
malformed, gets a 5xx.

The gateway runs with an API key (the fuzzer sends it), fake chat and supervisor peers, and
the scripted fake engine behind the leases (fast, so generated completions cost nothing).
Fuzzed: the chat, conversation and ``/v1`` operations this area owns. The SSE operation
``GET /api/chat`` never ends by design and is covered by the SSE tests instead.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.fake_engine import FakeEngine, responses_reply, text_reply
from tests.fakes.gateway_peers import FakePeers

from .code_peers import CodePeers

KEY = "fuzz-key-123"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    with FakeEngine() as fake:
        fake.embeddings = True  # every generated body reaches an engine that serves it
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


def test_fuzz_openapi_no_server_error(gateway_factory, peers, tmp_path):
    gw = gateway_factory(key=KEY)
    for title in ("a", "b"):
        peers.new_conv(title)
    schemathesis = Path(sys.executable).parent / "schemathesis"
    cmd = [
        str(schemathesis),
        "run",
        f"{gw.url}/openapi.json",
        "--checks",
        "not_a_server_error",
        "--header",
        f"Authorization: Bearer {KEY}",
        "--include-path-regex",
        "^/(api/chat|api/conversations|v1)",
        "--exclude-path",
        "/api/chat",
        "--max-examples",
        "15",
        "--max-time",
        "90",
        "--seed",
        "8",
        "--request-timeout",
        "30",
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path),
        "--no-color",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:] + "\n--- gateway ---\n" + gw.logs()[-4000:]
    # it really exercised the operations
    generated = re.search(r"(\d+) generated, (\d+) passed", out)
    assert generated and int(generated.group(1)) >= 200, out[-3000:]
    assert generated.group(1) == generated.group(2), out[-3000:]
