"""Issue 45 through the whole stack (gateway, chat, memory, recall, supervisor, perf) on the
scripted engine: a paired device chats through the relay stand-in, the real chat service
titles the conversation and streams the turn, and the relay's recording holds none of it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from loki_cli.e2e import E2EClient, E2ERefused
from tests.fakes.fake_engine import FakeEngine, text_reply
from tests.fakes.relay import Relay

from .conftest import whole_stack

KEY = "e2e-stack-key"
SECRET = "e2e-stack-secret-0123456789abcdef"
MESSAGE = "What is the code of the garden gate, 4471?"
REPLY = "The garden gate opens with 4471, hidden-reply-x9."


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeEngine]:
    with FakeEngine() as fake:
        fake.default = text_reply(REPLY)
        yield fake


@pytest.fixture(scope="module")
def api(tmp_path_factory, engine: FakeEngine) -> Iterator[httpx.Client]:
    home = tmp_path_factory.mktemp("e2e-stack") / "home"
    with whole_stack(home, engine.url, KEY, SECRET, 60) as client:
        yield client


def test_paired_device_chats_through_the_relay_on_the_whole_stack(api: httpx.Client):
    made = api.post("/api/e2e/devices", json={"name": "phone"})
    assert made.status_code == 201, made.text
    relay = Relay(str(api.base_url)).start()
    client = E2EClient(made.json()["code"], relay.url, timeout=60)
    try:
        cid = client.send(MESSAGE)["conversation"]
        text, seqs = "", []
        for event in client.events(cid):
            seqs.append(event.seq)
            choice = event.data["choices"][0]
            if choice["delta"].get("role") != "user":
                text += choice["delta"].get("content") or ""
            if choice.get("finish_reason"):
                break
        assert text == REPLY
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        # resume after the first event: the same events, exactly
        tail = []
        for event in client.events(cid, after=seqs[0]):
            tail.append(event.seq)
            if event.seq == seqs[-1]:
                break
        assert tail == seqs[1:]
        assert client.state(cid)["last_seq"] >= seqs[-1]
        assert any(c["id"] == cid for c in client.state()["conversations"])
        # revoked: refused at once
        api.delete(f"/api/e2e/devices/{made.json()['device']['id']}").raise_for_status()
        with pytest.raises(E2ERefused) as refused:
            client.state(cid)
        assert refused.value.status == 401
    finally:
        client.close()
        relay.stop()
    recorded = relay.recorded()
    for secret in ("garden gate", "4471", "hidden-reply-x9"):
        assert secret.encode() not in recorded, secret
