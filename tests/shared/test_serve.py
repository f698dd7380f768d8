"""The one way to answer a request subject (:func:`loki_shared.serve.serve`, issue 40), and
the services' handlers registered with it, on FastStream's in-memory ``TestNatsBroker`` (no
nats-server: delivery is the real-NATS tests' business, decoding and answers are this one's)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from faststream.nats import NatsBroker, TestNatsBroker
from pydantic import BaseModel

from loki_shared import errors, health, subjects
from loki_shared.messages.chat import ForwardRequest, StateReply
from loki_shared.messages.health import HealthReply, HealthRequest
from loki_shared.messages.recall import BlockReply, BlockRequest, BlocksReply, ToolReply
from loki_shared.nats import make_broker
from loki_shared.serve import decode, exchange, serve

#: Never dialled: TestNatsBroker replaces the connection.
NOWHERE = "nats://127.0.0.1:1"
REDIS_NOWHERE = "redis://127.0.0.1:1/0"


def broker() -> NatsBroker:
    return make_broker(NOWHERE, "serve-test")


async def ask(br: NatsBroker, subject: str, body: bytes | BaseModel) -> dict[str, Any]:
    """Request ``subject`` through the test broker; the answer's JSON."""
    reply = await br.request(body, subject)
    answer: dict[str, Any] = json.loads(reply.body)
    return answer


def assert_refused(answer: dict[str, Any], model: str, field: str) -> None:
    """The one malformed-request answer: ``invalid_request`` naming model and field."""
    assert answer.keys() == {"error"}, answer
    assert answer["error"]["type"] == "invalid_request"
    message = answer["error"]["message"]
    assert message.startswith(f"invalid {model}: {field}: "), message
    assert message.endswith("— resend it corrected"), message


# --- serve itself --------------------------------------------------------------------------------
async def test_the_request_is_decoded_to_its_exchange_type_and_the_reply_answers() -> None:
    br = broker()
    seen: list[BlockRequest] = []

    async def on_block(req: BlockRequest) -> BlockReply:
        seen.append(req)
        return BlockReply()

    serve(br, subjects.RECALL_BLOCK, on_block, queue=subjects.QUEUE_RECALL, max_workers=3)
    async with TestNatsBroker(br) as test:
        answer = await ask(test, subjects.RECALL_BLOCK, BlockRequest(seq=2**70))
    assert answer == BlockReply().model_dump(mode="json")
    assert seen == [BlockRequest(seq=2**70)]  # exact: pydantic read the raw JSON


def test_queue_and_workers_reach_the_subscriber() -> None:
    class Recorder:
        """Takes the subscriptions serve declares."""

        def __init__(self) -> None:
            self.declared: list[tuple[str, dict[str, Any]]] = []

        def subscriber(self, subject: str, **options: Any) -> Any:
            self.declared.append((subject, options))
            return lambda handler: handler

    async def on_block(req: BlockRequest) -> BlockReply:
        return BlockReply()

    br = Recorder()
    serve(br, subjects.RECALL_BLOCK, on_block, queue=subjects.QUEUE_RECALL, max_workers=3)  # type: ignore[arg-type]
    serve(br, subjects.RECALL_BLOCKS, on_block)  # type: ignore[arg-type]
    assert br.declared == [
        (subjects.RECALL_BLOCK, {"queue": subjects.QUEUE_RECALL, "max_workers": 3}),
        (subjects.RECALL_BLOCKS, {"queue": ""}),  # FastStream's default: one at a time
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "body"),
        (b"", "body"),
        (b"[1, 2]", "body"),
        (b"{}", "seq"),
        (b'{"seq": "seven"}', "seq"),
        (b'{"seq": 1', "body"),
    ],
)
async def test_a_malformed_request_is_refused_before_the_handler(body: bytes, field: str) -> None:
    br = broker()
    called: list[Any] = []

    async def on_block(req: BlockRequest) -> BlockReply:
        called.append(req)
        return BlockReply()

    serve(br, subjects.RECALL_BLOCK, on_block)
    async with TestNatsBroker(br) as test:
        assert_refused(await ask(test, subjects.RECALL_BLOCK, body), "BlockRequest", field)
    assert called == []


async def test_what_the_handler_raises_or_a_wrong_reply_is_the_answers_error() -> None:
    br = broker()

    async def on_block(req: BlockRequest) -> BlockReply:
        if req.seq == 1:
            raise errors.NotFound("no block 1")
        if req.seq == 2:
            raise KeyError("bug")
        return BlocksReply()  # type: ignore[return-value]  # the bug serve catches

    serve(br, subjects.RECALL_BLOCK, on_block)
    async with TestNatsBroker(br) as test:
        missing = await ask(test, subjects.RECALL_BLOCK, BlockRequest(seq=1))
        bug = await ask(test, subjects.RECALL_BLOCK, BlockRequest(seq=2))
        wrong = await ask(test, subjects.RECALL_BLOCK, BlockRequest(seq=3))
    assert missing == {"error": {"type": "not_found", "message": "no block 1"}}
    assert bug["error"]["type"] == "internal" and "KeyError" in bug["error"]["message"]
    assert wrong["error"]["type"] == "internal"
    assert "answered with BlockReply, not BlocksReply" in wrong["error"]["message"]


def test_the_types_come_from_exchanges_or_are_named() -> None:
    assert exchange(subjects.RECALL_BLOCK) == (BlockRequest, BlockReply)
    assert exchange(subjects.RECALL_BLOCK, BlockRequest, BlockReply) == (BlockRequest, BlockReply)
    with pytest.raises(TypeError, match="carries BlockReply, not ToolReply"):
        exchange(subjects.RECALL_BLOCK, reply=ToolReply)
    with pytest.raises(ValueError, match="event subject"):
        exchange(subjects.ENGINE_STATE)
    with pytest.raises(ValueError, match="not in EXCHANGES"):
        exchange(subjects.chat_instance("i1"))
    with pytest.raises(ValueError, match="not in EXCHANGES"):
        exchange(subjects.chat_instance("i1"), request=ForwardRequest)
    named = exchange(subjects.chat_instance("i1"), ForwardRequest, BaseModel)
    assert named == (ForwardRequest, BaseModel)


def test_decode_names_the_first_field_at_fault() -> None:
    assert decode(BlockRequest, b'{"seq": 4}') == BlockRequest(seq=4)
    with pytest.raises(errors.InvalidRequest) as refused:
        decode(BlockRequest, b'{"seq": []}')
    assert refused.value.message.startswith("invalid BlockRequest: seq: ")


async def test_health_subjects_are_served_with_named_types() -> None:
    br = broker()
    health.attach(br, "svc")
    instance = subjects.health("svc", health.instance_token())
    async with TestNatsBroker(br) as test:
        mine = HealthReply.model_validate(await ask(test, instance, HealthRequest()))
        anyone = HealthReply.model_validate(await ask(test, subjects.health("svc"), b"{}"))
        broken = await ask(test, subjects.health("svc"), b"not json")
    assert mine.ok and anyone.ok and mine.service == anyone.service == "svc"
    assert_refused(broken, "HealthRequest", "body")


# --- the services' handlers --------------------------------------------------------------------
async def test_recall_handlers_refuse_malformed_requests(tmp_path: Path) -> None:
    from loki_recall.service import RecallService
    from loki_recall.settings import Settings

    service = RecallService(
        Settings(nats_url=NOWHERE, redis_url=REDIS_NOWHERE, home=tmp_path, secret_key="k" * 26)
    )
    async with TestNatsBroker(service.broker) as test:
        bad = await ask(test, subjects.RECALL_TOOL, b'{"nonsense": true')
        no_name = await ask(test, subjects.RECALL_TOOL, b'{"arguments": {}}')
        purge = await ask(test, subjects.RECALL_PURGE, b"{}")
    assert_refused(bad, "ToolRequest", "body")
    assert_refused(no_name, "ToolRequest", "name")
    # a request the model takes but the handler refuses: the handler's own error
    assert purge["error"] == {
        "type": "invalid_request",
        "message": "name exactly one of conversation, project",
    }


async def test_memory_handlers_refuse_malformed_requests(tmp_path: Path) -> None:
    from loki_memory.service import MemoryService
    from loki_memory.settings import Settings

    service = MemoryService(
        Settings(nats_url=NOWHERE, redis_url=REDIS_NOWHERE, home=tmp_path, secret_key="k" * 26)
    )
    async with TestNatsBroker(service.broker) as test:
        body = b'{"project_id": "default", "page": "x"}'
        answer = await ask(test, subjects.PROJECTS_PAGE_WRITE, body)
    assert_refused(answer, "PageWriteRequest", "content")


async def test_perf_handlers_answer_and_refuse(tmp_path: Path) -> None:
    from loki_perf.service import PerfService
    from loki_perf.settings import Settings

    service = PerfService(Settings(nats_url=NOWHERE, home=tmp_path, perf_metrics_port=0))
    async with TestNatsBroker(service.broker) as test:
        losses = await ask(test, subjects.PERF_LOSSES, b'{"limit": 5}')
        too_many = await ask(test, subjects.PERF_LOSSES, b'{"limit": 0}')
        broken = await ask(test, subjects.PERF_LOSSES, b'{"limit": "all"}')
        summary = await ask(test, subjects.PERF_SUMMARY, b"{}")
    assert losses == {"error": None, "losses": []}
    assert too_many["error"]["type"] == "invalid_request"
    assert_refused(broken, "LossesRequest", "limit")
    assert summary["error"] is None and summary["detail"]["rebuilding"] is True


async def _unused(*_: Any, **__: Any) -> Any:
    raise AssertionError("not asked")


def supervisor_of(**over: Any) -> SimpleNamespace:
    """What :func:`loki_supervisor.service.build_broker` reads of a supervisor, every
    handler refusing to be asked but those in ``over``; ``instance`` "s1" (the process's
    id, said in every info answer)."""
    from loki_shared.messages.engine import EngineInfo

    parts: dict[str, Any] = dict(
        info=lambda: EngineInfo(),
        lease=_unused,
        renew=_unused,
        release=_unused,
        presets=_unused,
        bench=SimpleNamespace(handle=_unused),
        optimiser=SimpleNamespace(handle=_unused),
        replicas=None,
        instance="s1",
    )
    parts.update(over)
    return SimpleNamespace(**parts)


async def test_supervisor_handlers_decode_their_requests() -> None:
    from loki_shared.messages.engine import EngineInfo, Lease, LeaseRequest
    from loki_supervisor.service import build_broker

    leased: list[LeaseRequest] = []

    async def lease(req: LeaseRequest) -> Lease:
        leased.append(req)
        return Lease(lease_id="l1", base_url="http://engine")

    # one supervisor (LOKI_SUPERVISOR_REPLICATED off): handlers as before
    sup = supervisor_of(lease=lease, replicas=None)
    br = broker()
    build_broker(sup, br)  # type: ignore[arg-type]
    async with TestNatsBroker(br) as test:
        info = await ask(test, subjects.ENGINE_INFO, b"{}")
        granted = await ask(test, subjects.ENGINE_LEASE, LeaseRequest(kind="main", holder="chat"))
        refused = await ask(test, subjects.ENGINE_LEASE, b'{"kind": "main", "wait_s": "x"}')
    assert EngineInfo.model_validate(info) == EngineInfo(instance="s1")
    assert Lease.model_validate(granted).lease_id == "l1"
    assert leased == [LeaseRequest(kind="main", holder="chat")]
    assert_refused(refused, "LeaseRequest", "wait_s")


async def test_replicated_supervisors_send_measurements_to_the_leader() -> None:
    """Issue 44: with replicated supervisors ``loki.engine.bench`` and ``.optimise`` go
    through :meth:`Replicas.leader_op` (the queue group's subject and the instance's node
    subject), each decoded as its own request type."""
    from loki_shared.messages.engine import (
        BenchReply,
        BenchRequest,
        OptimiseReply,
        OptimiseRequest,
    )
    from loki_supervisor.service import build_broker

    asked: list[tuple[str, str, Any]] = []

    class Replicas:
        def __getattr__(self, name: str) -> Any:
            return _unused

        def connect(self, *_: Any) -> None:
            pass

        def leader_op(self, op: str, handler: Any, reply_type: Any) -> tuple[Any, Any]:
            async def queue(req: Any) -> Any:
                asked.append(("queue", op, req))
                return reply_type()

            async def node(req: Any) -> Any:
                asked.append(("node", op, req))
                return reply_type()

            return queue, node

    sup = supervisor_of(replicas=Replicas())
    br = broker()
    build_broker(sup, br)  # type: ignore[arg-type]
    async with TestNatsBroker(br) as test:
        bench = await ask(test, subjects.ENGINE_BENCH, BenchRequest(action="latest"))
        node = await ask(
            test, subjects.engine_node("s1", "optimise"), OptimiseRequest(action="status")
        )
        refused = await ask(test, subjects.ENGINE_BENCH, b'{"action": "dance"}')
    assert BenchReply.model_validate(bench).error is None
    assert OptimiseReply.model_validate(node).error is None
    assert asked == [
        ("queue", "bench", BenchRequest(action="latest")),
        ("node", "optimise", OptimiseRequest(action="status")),
    ]
    assert_refused(refused, "BenchRequest", "action")


async def test_chat_routes_and_forwarded_requests_decode_their_requests() -> None:
    from loki_chat.handlers import ChatHandlers

    handlers = ChatHandlers(
        SimpleNamespace(settings=None, store=None),  # type: ignore[arg-type]
        SimpleNamespace(instance="i1"),  # type: ignore[arg-type]
    )
    asked: list[Any] = []

    async def state(req: Any, forwarded: bool = False) -> StateReply:
        asked.append((req, forwarded))
        return StateReply(conversation=req.conversation)

    handlers.state = state  # type: ignore[method-assign]
    br = broker()
    handlers.register(br)
    forward = subjects.chat_instance("i1")
    async with TestNatsBroker(br) as test:
        direct = await ask(test, subjects.CHAT_STATE, b'{"conversation": "c1"}')
        missing = await ask(test, subjects.CHAT_STATE, b"{}")
        ahead = ForwardRequest(op="state", payload={"conversation": "c2"})
        forwarded = await ask(test, forward, ahead)
        unknown = await ask(test, forward, ForwardRequest(op="dance"))
        broken = await ask(test, forward, b'{"payload": {}}')
        send = await ask(test, subjects.CHAT_SEND, b'{"content": 5}')
    assert StateReply.model_validate(direct).conversation == "c1"
    assert_refused(missing, "StateRequest", "conversation")
    assert StateReply.model_validate(forwarded).conversation == "c2"
    assert [forwarded_ for _, forwarded_ in asked] == [False, True]
    assert unknown["error"] == {"type": "invalid_request", "message": "dance"}
    assert_refused(broken, "ForwardRequest", "op")
    assert_refused(send, "SendRequest", "content")
