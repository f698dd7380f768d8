"""Who may say what on the bus and in the store: one NATS user and one Redis ACL user per
service, with per-subject permissions and per-key patterns.

:data:`USERS` is the one table: the nats-server configuration is generated from it
(:func:`nats_config`, written by ``loki up`` into ``LOKI_HOME`` and by the compose init step,
see :mod:`loki_shared.credentials`), and docs/architecture.md shows it rendered by
:func:`markdown_table` (a test keeps the two equal). Every subject comes from
:mod:`loki_shared.subjects`.

How request/reply is allowed (NATS server authorization, ``permissions`` block):

- A *requester* publishes the request subject and subscribes its own reply inbox. Each user
  has an inbox prefix of its own, ``_INBOX.<user>`` (:func:`inbox_prefix`, passed to the
  client as nats-py's ``inbox_prefix``), and may subscribe only under it: no service can read
  the replies sent to another (the memory-status reply carries the memory key).
- A *responder* subscribes the request subject and answers on the reply subject the request
  carried: ``allow_responses`` lets it publish there once, and nowhere else.
- JetStream: publishing into a stream is a request (the server's acknowledgement comes to the
  inbox); creating, reading or consuming a stream goes through the ``$JS.API`` subjects of that
  stream only (:func:`js_stream`, :func:`js_consume`, :func:`js_bucket`).

Rules the table enforces (issue 22): only the gateway publishes ``loki.memory.key`` and answers
``loki.memory.status``; only chat publishes ``loki.chat.events.>``; only recall answers
``loki.recall.>``; only the memory service answers ``loki.projects.*`` requests and
publishes ``loki.projects.changed``; only the supervisor answers ``loki.engine.>``; only the
workspace service answers ``loki.workspace.*`` (chat asks them all, the gateway the Code
panel's); perf records
are published by chat, the gateway and the bench (and by ``backup``, which writes a backup's
records back into an empty stack on restore); each service answers only its own health subjects.

Redis (issue 36): the same table gives each user its Redis ACL user (:func:`redis_config`):
the key patterns it owns (read and write) and those it only reads, the command categories of
:data:`REDIS_COMMANDS`, no Pub/Sub channel; the ``default`` user is off, and the health checks
log in as :data:`REDIS_HEALTH_USER`, which may only ``PING``. Only the gateway writes the
memory-key record ``loki:memory:kdf`` (recall and memory read it); only chat writes
conversations (``loki:chat:*``, attachments included: the gateway writes those under
``loki:chat:att:*``), tasks and the recall purge queue; only recall the archive; only memory
the projects; only the supervisor the presets; only the workspace service its records
(``loki:workspace:*``); only the gateway the paired devices (``loki:e2e:*``); ``backup``
reads and writes every ``loki:*`` key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from . import subjects

#: NATS's default reply-inbox prefix; each user gets ``_INBOX.<user>`` under it.
INBOX = "_INBOX"


def inbox_prefix(user: str) -> str:
    """The reply-inbox prefix of ``user`` (``_INBOX.<user>``): nats-py's ``inbox_prefix``."""
    return f"{INBOX}.{user}"


def js_stream(stream: str) -> tuple[str, ...]:
    """``$JS.API`` subjects to create, update and read the configuration of ``stream``."""
    return (
        "$JS.API.INFO",
        f"$JS.API.STREAM.CREATE.{stream}",
        f"$JS.API.STREAM.UPDATE.{stream}",
        f"$JS.API.STREAM.INFO.{stream}",
    )


def js_consume(stream: str) -> tuple[str, ...]:
    """``$JS.API`` subjects to read ``stream`` through a consumer (ordered or pull), with the
    acknowledgement and flow-control replies a consumer sends."""
    return (
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.DELETE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
        f"$JS.ACK.{stream}.>",
        f"$JS.FC.{stream}.>",
    )


def js_bucket(bucket: str) -> tuple[str, ...]:
    """Subjects to create, read and write the JetStream key-value ``bucket``."""
    stream = f"KV_{bucket}"
    return (
        *js_stream(stream),
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$KV.{bucket}.>",
    )


def _health(service: str) -> tuple[str, ...]:
    """Both health subjects of ``service`` (``loki.health.<service>`` and ``.<instance>``)."""
    base = subjects.health(service)
    return (base, f"{base}.*")


def _dedup(items: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


@dataclass(frozen=True)
class Grant:
    """One NATS user and what it may do.

    Attributes:
        user: the user name (the service's name; ``cli``, ``backup``, ``bench`` for tools).
        who: the processes that log in as this user, in words.
        publish: subjects (NATS wildcards allowed) it may publish: events, requests, stream
            writes and ``$JS.API`` calls.
        subscribe: subjects it may subscribe, besides its own reply inbox (always allowed,
            see :func:`inbox_prefix`).
        responds: whether it answers requests (NATS ``allow_responses``: it may publish once
            on the reply subject of a request it received).
        redis_keys: Redis key patterns (glob, as Redis ACL ``~``) it reads and writes.
        redis_reads: Redis key patterns it only reads (ACL ``%R~``).
        redis_extra: ACL rules added after :data:`REDIS_COMMANDS` (e.g. ``+keys``).
    """

    user: str
    who: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...] = ()
    responds: bool = False
    redis_keys: tuple[str, ...] = ()
    redis_reads: tuple[str, ...] = ()
    redis_extra: tuple[str, ...] = ()

    def redis_rules(self) -> list[str]:
        """This grant's Redis ACL rules (after ``reset``): key patterns, no channels, the
        commands. A user with no key gets ``PING`` only."""
        keys = [f"~{p}" for p in self.redis_keys] + [f"%R~{p}" for p in self.redis_reads]
        if not keys:
            return ["resetchannels", "-@all", "+ping"]
        return [*keys, "resetchannels", *REDIS_COMMANDS, *self.redis_extra]

    def nats_permissions(self) -> dict[str, object]:
        """This grant as nats-server's ``permissions`` block (a JSON-compatible dict)."""
        out: dict[str, object] = {
            "publish": {"allow": list(_dedup(self.publish))},
            "subscribe": {"allow": [*_dedup(self.subscribe), f"{inbox_prefix(self.user)}.>"]},
        }
        if self.responds:
            out["allow_responses"] = True
        return out


_CHAT_REQUESTS = (
    subjects.CHAT_SEND,
    subjects.CHAT_CONTROL,
    subjects.CHAT_STATE,
    subjects.CHAT_REPLAY,
    subjects.CHAT_CONVERSATIONS,
    subjects.CHAT_TASKS,
    subjects.CHAT_MCP,
    subjects.CHAT_CODE,
)
#: The Code panel's workspace requests (issue 43): the gateway asks the workspace service.
_WORKSPACE_GATEWAY = (
    subjects.WORKSPACE_CREATE,
    subjects.WORKSPACE_INFO,
    subjects.WORKSPACE_FILES,
    subjects.WORKSPACE_READ,
)
#: Every request subject the workspace service answers (issue 43): chat asks them all (the
#: code tools).
_WORKSPACE_REQUESTS = tuple(
    row.subject
    for row in subjects.EXCHANGES.values()
    if row.subject.startswith(f"{subjects.PREFIX}.workspace.") and row.reply is not None
)
_ENGINE_REQUESTS = (
    subjects.ENGINE_INFO,
    subjects.ENGINE_LEASE,
    subjects.ENGINE_RENEW,
    subjects.ENGINE_RELEASE,
    subjects.ENGINE_PRESETS,
)
#: Measuring the engine (benchmark, optimiser): the gateway and the benchmarks ask it.
_ENGINE_MEASURE = (subjects.ENGINE_BENCH, subjects.ENGINE_OPTIMISE)
#: Every request subject the memory service answers (not ``loki.projects.changed``, its event).
_PROJECTS_REQUESTS = tuple(
    row.subject
    for row in subjects.EXCHANGES.values()
    if row.subject.startswith(subjects.PROJECTS_PREFIX + ".") and row.reply is not None
)
#: What the chat service asks the memory service for (the block and the model's tools).
_PROJECTS_CHAT = (
    subjects.PROJECTS_ACTIVE,
    subjects.PROJECTS_BLOCK,
    subjects.PROJECTS_PAGE_READ,
    subjects.PROJECTS_PAGE_WRITE,
    subjects.PROJECTS_PAGE_LIST,
    subjects.PROJECTS_PAGE_SEARCH,
    subjects.PROJECTS_TRACKER_LOG,
    subjects.PROJECTS_TRACKER_READ,
    subjects.PROJECTS_TRACKER_LIST,
)
_RECALL_ALL = f"{subjects.PREFIX}.recall.>"
_ENGINE_ALL = f"{subjects.PREFIX}.engine.>"
_CHAT_EVENTS = f"{subjects.CHAT_EVENTS_PREFIX}.>"
_CHAT_INSTANCES = f"{subjects.CHAT_INSTANCE_PREFIX}.*"
_HEALTH_ALL = f"{subjects.HEALTH_PREFIX}.>"

#: Redis command categories of a service user: reads, writes, key commands (SCAN, EXPIRE,
#: TYPE...), Lua scripts (the fenced writes), MULTI/EXEC, the connection commands (AUTH, PING,
#: SELECT, HELLO, CLIENT SETINFO); never one of ``@dangerous`` (FLUSHALL, KEYS, CONFIG,
#: DEBUG, ACL...). Categories: https://redis.io/docs/latest/operate/oss_and_stack/management/security/acl/
REDIS_COMMANDS: tuple[str, ...] = (
    "-@all",
    "+@read",
    "+@write",
    "+@keyspace",
    "+@scripting",
    "+@transaction",
    "+@connection",
    "-@dangerous",
)
#: The Redis user of the health checks (compose's ``redis-cli ping``): ``PING`` only.
REDIS_HEALTH_USER = "health"
#: Key patterns of the Redis table (every Loki key starts with ``loki:``).
REDIS_ALL = "loki:*"
_R_CHAT = "loki:chat:*"
_R_ATTACHMENTS = "loki:chat:att:*"
_R_TASKS = "loki:task:*"
_R_RECALL = "loki:recall:*"
_R_PURGE = ("loki:recall:purge", "loki:recall:gone")
_R_PROJECTS = "loki:projects:*"
_R_ENGINE = "loki:engine:*"
_R_KDF = "loki:memory:kdf"
_R_WORKSPACE = "loki:workspace:*"
_R_E2E = "loki:e2e:*"  # paired devices (issue 45, loki_gateway.e2e)

#: The table: every NATS user Loki knows, in the order docs/architecture.md shows them.
USERS: tuple[Grant, ...] = (
    Grant(
        user="gateway",
        who="the gateway (HTTP API, SSE, memory key)",
        publish=(
            *_CHAT_REQUESTS,
            *_ENGINE_REQUESTS,
            *_ENGINE_MEASURE,
            subjects.RECALL_BLOCK,
            subjects.RECALL_BLOCKS,
            subjects.RECALL_PURGE,
            *_PROJECTS_REQUESTS,
            *_WORKSPACE_GATEWAY,
            subjects.PERF_SUMMARY,
            subjects.PERF_LOSSES,
            subjects.MEMORY_KEY,
            subjects.PERF_RECORD,
            *js_stream(subjects.STREAM_PERF),
        ),
        subscribe=(
            _CHAT_EVENTS,
            subjects.MEMORY_STATUS,
            subjects.PROJECTS_CHANGED,
            subjects.ENGINE_STATE,  # the web UI's engine pill (GET /api/engine/events)
        ),
        responds=True,
        redis_keys=(_R_ATTACHMENTS, _R_KDF, _R_E2E),
    ),
    Grant(
        user="chat",
        who="the chat service (turns, compaction)",
        publish=(
            _CHAT_EVENTS,
            _CHAT_INSTANCES,
            *_ENGINE_REQUESTS,
            subjects.RECALL_ARCHIVE,
            subjects.RECALL_TOOL,
            subjects.RECALL_PURGE,
            *_PROJECTS_CHAT,
            *_WORKSPACE_REQUESTS,
            subjects.PERF_RECORD,
            subjects.EVENTS_COMPACTION,
            *js_stream(subjects.STREAM_PERF),
            *js_consume(subjects.STREAM_PERF),
            *js_stream(subjects.STREAM_EVENTS),
            *_health("chat"),
        ),
        subscribe=(
            *_CHAT_REQUESTS,
            _CHAT_INSTANCES,
            subjects.PROJECTS_CHANGED,
            subjects.ENGINE_STATE,  # PREWARM after an engine restart
            *_health("chat"),
        ),
        responds=True,
        redis_keys=(_R_CHAT, _R_TASKS, *_R_PURGE),
    ),
    Grant(
        user="recall",
        who="the recall service (archive, recall tools, memory)",
        publish=(
            subjects.RECALL_BLOCK,  # its own routability probe
            subjects.MEMORY_STATUS,
            subjects.EVENTS_ARCHIVE,
            *js_stream(subjects.STREAM_EVENTS),
            *_health("recall"),
        ),
        subscribe=(_RECALL_ALL, subjects.MEMORY_KEY, *_health("recall")),
        responds=True,
        redis_keys=(_R_RECALL,),
        redis_reads=(_R_KDF,),
    ),
    Grant(
        user="memory",
        who="the memory service (projects, memory pages, trackers)",
        publish=(
            subjects.PROJECTS_CHANGED,
            subjects.PROJECTS_ACTIVE,  # its own routability probe
            subjects.MEMORY_STATUS,
            *_health("memory"),
        ),
        subscribe=(*_PROJECTS_REQUESTS, subjects.MEMORY_KEY, *_health("memory")),
        responds=True,
        redis_keys=(_R_PROJECTS,),
        redis_reads=(_R_KDF,),
    ),
    Grant(
        user="engine-supervisor",
        who="the engine supervisor (llama-server, leases, presets)",
        publish=(
            subjects.ENGINE_STATE,
            f"{subjects.ENGINE_NODE_PREFIX}.>",  # a replica forwards leases to the leader
            *_health("engine-supervisor"),
        ),
        subscribe=(_ENGINE_ALL, *_health("engine-supervisor")),
        responds=True,
        redis_keys=(_R_ENGINE,),
    ),
    Grant(
        user="perf",
        who="the perf service (the perf ring, /metrics)",
        publish=(
            *js_stream(subjects.STREAM_PERF),
            *js_consume(subjects.STREAM_PERF),
            *js_bucket(subjects.KV_PERF_TOTALS),
            subjects.ENGINE_BENCH,  # the last benchmark runs, exported on /metrics
            *_health("perf"),
        ),
        subscribe=(
            subjects.PERF_SUMMARY,
            subjects.PERF_LOSSES,
            subjects.PERF_CACHERAM,
            *_health("perf"),
        ),
        responds=True,
    ),
    Grant(
        user="workspace",
        who="the workspace service (workspaces, files, sandboxed commands)",
        publish=(
            subjects.WORKSPACE_INFO,  # its own routability probe
            *_health("workspace"),
        ),
        subscribe=(*_WORKSPACE_REQUESTS, *_health("workspace")),
        responds=True,
        redis_keys=(_R_WORKSPACE,),
    ),
    Grant(
        user="cli",
        who="the `loki` command (`loki up` waits on the engine; health checks by hand)",
        publish=(subjects.ENGINE_INFO, _HEALTH_ALL),
    ),
    Grant(
        user="backup",
        who="`loki backup` / `loki restore`, `python -m loki_shared.backup`",
        publish=(
            subjects.PERF_RECORD,
            subjects.EVENTS_COMPACTION,
            subjects.EVENTS_ARCHIVE,
            "$JS.API.>",
            "$KV.>",
        ),
        redis_keys=(REDIS_ALL,),
        redis_extra=("+keys",),  # the snapshot script lists loki:* with KEYS
    ),
    Grant(
        user="bench",
        who="the benchmarks (`python -m bench`), against a stack of their own",
        publish=(
            *_CHAT_REQUESTS,
            *_ENGINE_REQUESTS,
            *_ENGINE_MEASURE,
            subjects.RECALL_ARCHIVE,
            subjects.RECALL_TOOL,
            subjects.PERF_RECORD,
            *js_stream(subjects.STREAM_PERF),
            *js_consume(subjects.STREAM_PERF),
        ),
        subscribe=(_CHAT_EVENTS,),
        redis_reads=(_R_RECALL,),
    ),
)

#: The services' users (the seven long-running processes).
SERVICES: tuple[str, ...] = (
    "gateway",
    "chat",
    "recall",
    "memory",
    "engine-supervisor",
    "perf",
    "workspace",
)


def grant(user: str) -> Grant:
    """The row of ``user``.

    Raises:
        KeyError: no such user in :data:`USERS`.
    """
    for row in USERS:
        if row.user == user:
            return row
    raise KeyError(user)


#: nats-server's ``max_payload`` (bytes): the largest message, a send carrying its images.
MAX_PAYLOAD = 32 * 1024 * 1024


def nats_config(
    passwords: Mapping[str, str],
    extra: Mapping[str, tuple[str, dict[str, object]]] | None = None,
) -> str:
    """The ``authorization`` block of nats-server's configuration for :data:`USERS`.

    Args:
        passwords: user -> password, one for every user of :data:`USERS`.
        extra: more users, name -> (password, permissions block or ``{}`` for none); the
            test fixtures add their own harness user this way.

    Returns:
        Configuration text (nats-server accepts JSON values in its config format); the
        server's other options (listen address, JetStream) stay on its command line.

    Raises:
        KeyError: a user of the table has no password.
    """
    users: list[dict[str, object]] = []
    for row in USERS:
        users.append(
            {"user": row.user, "password": passwords[row.user], **_perm(row.nats_permissions())}
        )
    for name, (password, perms) in dict(extra or {}).items():
        users.append({"user": name, "password": password, **_perm(perms)})
    body = json.dumps({"users": users}, indent=2)
    head = "# Generated by loki_shared.permissions: edit the table there, not this file."
    # A send carrying images holds them as data URLs (``LOKI_UPLOAD_MAX_MB`` each, base64):
    # nats-server's default 1 MiB per message is too small for them.
    return f"{head}\nmax_payload: {MAX_PAYLOAD}\nauthorization: {body}\n"


def redis_users() -> tuple[str, ...]:
    """Every Redis ACL user: the table's users and :data:`REDIS_HEALTH_USER`."""
    return (*(row.user for row in USERS), REDIS_HEALTH_USER)


def redis_config(
    passwords: Mapping[str, str], extra: Mapping[str, tuple[str, list[str]]] | None = None
) -> str:
    """Redis's configuration: the ACL users of :data:`USERS` (:meth:`Grant.redis_rules`), the
    health user, and the ``default`` user off with no password (a client that does not log in
    can do nothing; see the comment below for why its permissions stay whole).

    Args:
        passwords: Redis user -> password, one for each of :func:`redis_users`.
        extra: more users, name -> (password, ACL rules); the test fixtures add their own.

    Returns:
        ``user`` directives of redis.conf. Passwords appear only as their SHA-256 (``#hex``),
        so the file holds no secret.

    Raises:
        KeyError: a user has no password.
    """
    rules: dict[str, tuple[str, list[str]]] = {
        row.user: (passwords[row.user], row.redis_rules()) for row in USERS
    }
    rules[REDIS_HEALTH_USER] = (passwords[REDIS_HEALTH_USER], ["resetchannels", "-@all", "+ping"])
    rules.update(dict(extra or {}))
    lines = [
        "# Generated by loki_shared.permissions: edit the table there, not this file.",
        # `default` is off and has no password: no client can log in as it. Its permissions
        # stay whole because Redis 7.0 replays the append-only file's MULTI/EXEC blocks as
        # `default` and checks them at EXEC: without them a restart drops every transaction
        # (Loki's fenced writes), logging "NOPERM ACLs rules changed ..." (issue 36).
        "user default reset off ~* &* +@all",
    ]
    for name, (password, acl) in rules.items():
        digest = hashlib.sha256(password.encode()).hexdigest()
        lines.append(" ".join(["user", name, "reset", "on", f"#{digest}", *acl]))
    return "\n".join(lines) + "\n"


def _perm(perms: Mapping[str, object]) -> dict[str, object]:
    return {"permissions": dict(perms)} if perms else {}


def markdown_table() -> str:
    """:data:`USERS` as the Markdown table docs/architecture.md shows (one row per user)."""

    def cell(items: tuple[str, ...]) -> str:
        return "<br>".join(f"`{s}`" for s in _dedup(items)) or "—"

    lines = [
        "| user | who | publishes | subscribes (besides `_INBOX.<user>.>`) | answers requests |",
        "|---|---|---|---|---|",
    ]
    for row in USERS:
        lines.append(
            f"| `{row.user}` | {row.who} | {cell(row.publish)} | {cell(row.subscribe)} | "
            f"{'yes' if row.responds else 'no'} |"
        )
    return "\n".join(lines)
