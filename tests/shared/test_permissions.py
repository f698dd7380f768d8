"""Issue 22, credentials on the bus and the store: the permission table's rules, and the real
nats-server and Redis enforcing them (a NATS of this module's own, started with the table's
configuration like every test NATS; the harness user ``test`` watches what gets through).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.errors
import pytest
import redis

from loki_shared import permissions, subjects
from loki_shared.perf_publish import build_record, ensure_perf_stream, publish_record
from loki_shared.settings import LokiSettings
from tests.conftest import AUTH, RunningServer, plain_url, start_nats

ROOT = Path(__file__).resolve().parents[2]


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` one or more trailing tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def allowed(user: str, kind: str) -> list[str]:
    """The ``allow`` list of ``kind`` (publish or subscribe) in the ``permissions`` block the
    NATS configuration gives ``user`` (the user's own reply inbox included there, not here)."""
    block = permissions.grant(user).nats_permissions()[kind]
    assert isinstance(block, dict) and set(block) == {"allow"}, block
    return list(block["allow"])


def may_publish(user: str, subject: str) -> bool:
    return any(matches(p, subject) for p in allowed(user, "publish"))


def may_subscribe(user: str, subject: str) -> bool:
    return any(matches(p, subject) for p in allowed(user, "subscribe"))


def publishers(subject: str) -> set[str]:
    return {row.user for row in permissions.USERS if may_publish(row.user, subject)}


def subscribers(subject: str) -> set[str]:
    return {row.user for row in permissions.USERS if may_subscribe(row.user, subject)}


# --- the table's rules ---------------------------------------------------------------------


def test_only_the_gateway_publishes_the_memory_key_and_answers_memory_status() -> None:
    assert publishers(subjects.MEMORY_KEY) == {"gateway"}
    assert subscribers(subjects.MEMORY_STATUS) == {"gateway"}


def test_only_chat_publishes_the_chat_events() -> None:
    assert publishers(subjects.chat_events("c1")) == {"chat"}
    assert publishers(f"{subjects.CHAT_EVENTS_PREFIX}.>") == {"chat"}


def test_only_recall_answers_recall_and_only_the_supervisor_the_engine() -> None:
    for subject in (
        subjects.RECALL_ARCHIVE,
        subjects.RECALL_TOOL,
        subjects.RECALL_BLOCK,
        subjects.RECALL_BLOCKS,
    ):
        assert subscribers(subject) == {"recall"}, subject
    for subject in (
        subjects.ENGINE_INFO,
        subjects.ENGINE_LEASE,
        subjects.ENGINE_RENEW,
        subjects.ENGINE_RELEASE,
        subjects.ENGINE_PRESETS,
    ):
        assert subscribers(subject) == {"engine-supervisor"}, subject
    assert publishers(subjects.ENGINE_STATE) == {"engine-supervisor"}
    for subject in (subjects.PERF_SUMMARY, subjects.PERF_LOSSES, subjects.PERF_CACHERAM):
        assert subscribers(subject) == {"perf"}, subject
    assert subscribers(subjects.CHAT_SEND) == {"chat"}


def test_perf_records_come_from_chat_the_gateway_and_the_bench_only() -> None:
    # backup writes a backup's records back into an empty stack on restore
    assert publishers(subjects.PERF_RECORD) == {"chat", "gateway", "bench", "backup"}


def test_no_user_reads_another_users_replies() -> None:
    for row in permissions.USERS:
        # each reads its own replies (nats-py's inbox_prefix), through the NATS configuration
        assert may_subscribe(row.user, f"{permissions.inbox_prefix(row.user)}.abc.1"), row.user
        for other in permissions.USERS:
            if other.user != row.user:
                inbox = f"{permissions.inbox_prefix(other.user)}.abc.1"
                assert not may_subscribe(row.user, inbox), (row.user, other.user)
        assert not may_subscribe(row.user, "_INBOX.abc"), row.user


def test_only_the_services_that_answer_requests_may_respond() -> None:
    responders = {"gateway", "chat", "recall", "memory", "engine-supervisor", "perf", "workspace"}
    for row in permissions.USERS:
        block = row.nats_permissions()
        # nats-server's allow_responses: a reply to a request it received, nothing more
        assert block.get("allow_responses", False) is (row.user in responders), row.user
    assert {row.user for row in permissions.USERS} >= responders | {"cli", "backup", "bench"}


def test_only_the_workspace_service_answers_workspace_requests() -> None:
    for subject in (subjects.WORKSPACE_RUN, subjects.WORKSPACE_WRITE, subjects.WORKSPACE_INFO):
        assert subscribers(subject) == {"workspace"}, subject
    # chat runs the code tools; the gateway's Code panel only reads (and creates)
    assert publishers(subjects.WORKSPACE_RUN) == {"chat"}
    assert "gateway" in publishers(subjects.WORKSPACE_READ)
    assert permissions.grant("workspace").redis_keys == ("loki:workspace:*",)


def test_the_table_cannot_be_changed_at_run_time() -> None:
    row = permissions.grant("cli")
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.subscribe = (*row.subscribe, "_INBOX.>")  # type: ignore[misc]
    assert "_INBOX.>" not in permissions.grant("cli").nats_permissions()["subscribe"]["allow"]  # type: ignore[index]


def test_each_service_answers_its_own_health_subject_only() -> None:
    for service in permissions.SERVICES:
        if service == "gateway":  # checked over HTTP (/healthz)
            continue
        assert subscribers(subjects.health(service, "host1")) == {service}
        assert subscribers(subjects.health(service)) == {service}


def test_the_table_in_docs_is_the_table_in_code() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    begin, end = "<!-- permissions:begin -->", "<!-- permissions:end -->"
    assert begin in doc and end in doc, "docs/architecture.md lost the permission table markers"
    shown = doc.split(begin, 1)[1].split(end, 1)[0].strip()
    assert shown == permissions.markdown_table(), (
        "docs/architecture.md's permission table differs from loki_shared.permissions: "
        "paste permissions.markdown_table() between the markers"
    )


# --- the real server ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_nats(tmp_path_factory.mktemp("perm-nats") / "nats")
    yield server
    server.stop()


class Login:
    """A nats-py connection as one user of the table, keeping the errors the server sent."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: nats.aio.client.Client | None = None

    async def connect(self, url: str, user: str) -> Login:
        async def error_cb(exc: Exception) -> None:
            self.errors.append(str(exc))

        self.nc = await nats.connect(
            plain_url(url),
            user=user,
            password=AUTH.creds.nats[user],
            inbox_prefix=permissions.inbox_prefix(user),
            error_cb=error_cb,
            allow_reconnect=False,
        )
        return self


@pytest.fixture
async def login(auth_nats: RunningServer) -> AsyncIterator:
    opened: list[Login] = []

    async def make(user: str) -> Login:
        conn = await Login().connect(auth_nats.url, user)
        opened.append(conn)
        return conn

    yield make
    for conn in opened:
        if conn.nc and not conn.nc.is_closed:
            await conn.nc.close()


@pytest.fixture
async def harness(auth_nats: RunningServer) -> AsyncIterator:
    nc = await nats.connect(auth_nats.url)  # user `test`: sees everything
    yield nc
    await nc.close()


async def test_a_client_without_credentials_is_refused(auth_nats: RunningServer) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            plain_url(auth_nats.url), allow_reconnect=False, max_reconnect_attempts=0
        )
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            plain_url(auth_nats.url),
            user="chat",
            password=AUTH.creds.nats["gateway"],  # another user's password
            allow_reconnect=False,
            max_reconnect_attempts=0,
        )


async def _published(harness, conn: Login, subject: str, tries: int = 1) -> list:
    """Publish on ``subject`` as ``conn`` (up to ``tries`` times, until the harness got one);
    return what the harness received there.

    (Retried for the allowed cases: on this nats-server a message published right after a
    new subscriber's flush is now and then not delivered, with or without authorization.)"""
    got: list = []
    sub = await harness.subscribe(subject, cb=collector(got))
    await harness.flush()
    for _ in range(tries):
        await conn.nc.publish(subject, b"{}")
        await conn.nc.flush()
        await harness.flush()
        for _ in range(15):
            if got:
                break
            await asyncio.sleep(0.02)
        if got:
            break
    await sub.unsubscribe()
    return got


def collector(out: list):
    """A nats-py message callback appending to ``out``."""

    async def cb(msg) -> None:
        out.append(msg)

    return cb


@pytest.mark.parametrize(
    ("user", "subject"),
    [
        ("chat", subjects.MEMORY_KEY),
        ("recall", subjects.MEMORY_KEY),
        ("gateway", subjects.chat_events("c1")),
        ("perf", subjects.PERF_RECORD),
        ("engine-supervisor", subjects.RECALL_TOOL),
        ("recall", subjects.ENGINE_STATE),
        ("cli", subjects.PERF_RECORD),
    ],
)
async def test_a_service_cannot_publish_what_it_is_not_allowed(
    login, harness, user: str, subject: str
) -> None:
    conn = await login(user)
    got = await _published(harness, conn, subject)
    assert got == [], f"{user} published {subject}"
    assert any("permissions violation for publish" in e for e in conn.errors), conn.errors


@pytest.mark.parametrize(
    ("user", "subject"),
    [
        ("chat", subjects.MEMORY_STATUS),  # would answer with a forged key state
        ("perf", f"{subjects.CHAT_EVENTS_PREFIX}.>"),  # every token of every conversation
        ("chat", subjects.RECALL_TOOL),
        ("perf", "_INBOX.>"),  # every reply, the memory status too
        ("chat", f"{permissions.inbox_prefix('recall')}.>"),
    ],
)
async def test_a_service_cannot_subscribe_what_it_is_not_allowed(
    login, harness, user: str, subject: str
) -> None:
    conn = await login(user)
    got: list = []
    await conn.nc.subscribe(subject, cb=collector(got))
    await conn.nc.flush()
    await asyncio.sleep(0.1)
    assert any("permissions violation for subscription" in e for e in conn.errors), conn.errors
    concrete = subject.replace(">", "x").replace("*", "x")
    await harness.publish(concrete, b"{}")
    await harness.flush()
    await asyncio.sleep(0.2)
    assert got == []


@pytest.mark.parametrize(
    ("user", "subject"),
    [
        ("gateway", subjects.MEMORY_KEY),
        ("chat", subjects.chat_events("c1")),
        ("engine-supervisor", subjects.ENGINE_STATE),
        ("recall", subjects.EVENTS_ARCHIVE),
        ("chat", subjects.EVENTS_COMPACTION),
    ],
)
async def test_an_allowed_publication_goes_through(login, harness, user: str, subject: str) -> None:
    conn = await login(user)
    got = await _published(harness, conn, subject, tries=5)
    assert got and conn.errors == [], (got, conn.errors)


@pytest.mark.parametrize(
    ("requester", "responder", "subject"),
    [
        ("gateway", "chat", subjects.CHAT_SEND),
        ("gateway", "recall", subjects.RECALL_BLOCKS),
        ("chat", "recall", subjects.RECALL_TOOL),
        ("chat", "engine-supervisor", subjects.ENGINE_LEASE),
        ("gateway", "perf", subjects.PERF_SUMMARY),
        ("recall", "gateway", subjects.MEMORY_STATUS),
        ("chat", "chat", subjects.chat_instance("i2")),
        ("cli", "engine-supervisor", subjects.ENGINE_INFO),
        ("cli", "perf", subjects.health("perf")),
        ("bench", "chat", subjects.CHAT_SEND),
    ],
)
async def test_request_and_reply_between_services(
    login, requester: str, responder: str, subject: str
) -> None:
    server = await login(responder)

    async def answer(msg) -> None:
        await msg.respond(json.dumps({"from": responder}).encode())

    await server.nc.subscribe(subject, cb=answer)
    await server.nc.flush()
    client = await login(requester)
    reply = await client.nc.request(subject, b"{}", timeout=2)
    assert json.loads(reply.data) == {"from": responder}
    assert reply.subject.startswith(permissions.inbox_prefix(requester) + ".")
    assert server.errors == [] and client.errors == [], (server.errors, client.errors)


async def test_a_responder_cannot_publish_on_another_inbox(login, harness) -> None:
    """``allow_responses`` lets a responder answer the request it got, not write into an
    inbox it picked itself."""
    perf = await login("perf")
    inbox = f"{permissions.inbox_prefix('recall')}.x.1"
    got = await _published(harness, perf, inbox)
    assert got == [] and perf.errors, perf.errors


async def test_perf_records_through_jetstream_with_each_publishers_login(login) -> None:
    """perf creates the ring and consumes it; chat, the gateway and the bench store records
    in it (JetStream acknowledgement on their own inboxes); perf keeps its checkpoint bucket."""
    perf = await login("perf")
    js = perf.nc.jetstream()
    await ensure_perf_stream(js)
    received: list = []
    sub = await js.subscribe(
        subjects.PERF_RECORD,
        stream=subjects.STREAM_PERF,
        ordered_consumer=True,
        cb=collector(received),
    )
    for user in ("chat", "gateway", "bench"):
        conn = await login(user)
        record = build_record(kind="main", messages=[], model=user)
        assert await publish_record(conn.nc, record), (user, conn.errors)
        assert conn.errors == [], (user, conn.errors)
    recall = await login("recall")
    refused = build_record(kind="main", messages=[], model="recall")
    assert not await publish_record(recall.nc, refused, timeout=0.5, retry_s=0)
    for _ in range(50):
        if len(received) >= 3:
            break
        await asyncio.sleep(0.1)
    assert sorted(json.loads(m.data)["model"] for m in received) == ["bench", "chat", "gateway"]
    kv = await js.create_key_value(bucket=subjects.KV_PERF_TOTALS)
    await kv.put("totals", b"{}")
    assert (await kv.get("totals")).value == b"{}"
    await sub.unsubscribe()
    assert perf.errors == [], perf.errors


# --- Redis -----------------------------------------------------------------------------------


def test_redis_without_the_password_is_refused(redis_url: str) -> None:
    bare = redis.Redis.from_url(plain_url(redis_url))
    with pytest.raises(redis.exceptions.AuthenticationError):
        bare.ping()
    bare.close()
    wrong = redis.Redis.from_url(plain_url(redis_url), username="chat", password="not-the-password")
    with pytest.raises(redis.exceptions.AuthenticationError):
        wrong.ping()
    wrong.close()
    settings = LokiSettings(
        redis_url=plain_url(redis_url),
        redis_user="chat",
        redis_password=AUTH.creds.redis["chat"],
        home=Path("."),
    )
    ok = redis.Redis.from_url(settings.redis_url, **settings.redis_options())
    assert ok.ping() is True
    ok.close()


async def test_chat_stores_a_compaction_event_in_the_events_stream(login) -> None:
    """The audit stream as chat writes it (``loki_chat.compaction.events``): created when
    missing, the event stored and acknowledged on chat's own inbox; recall may not write it."""
    from nats.js.api import StreamConfig

    chat = await login("chat")
    js = chat.nc.jetstream()
    config = StreamConfig(
        name=subjects.STREAM_EVENTS,
        subjects=[subjects.EVENTS_COMPACTION, subjects.EVENTS_ARCHIVE],
    )
    await js.add_stream(config=config)
    ack = await js.publish(
        subjects.EVENTS_COMPACTION, b"{}", timeout=2.0, stream=subjects.STREAM_EVENTS
    )
    assert ack.stream == subjects.STREAM_EVENTS and chat.errors == [], chat.errors
    recall = await login("recall")
    with pytest.raises(nats.errors.Error):
        await recall.nc.jetstream().publish(subjects.EVENTS_COMPACTION, b"{}", timeout=0.5)
