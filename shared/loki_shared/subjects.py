"""Every NATS subject, queue group and JetStream stream Loki uses. Nowhere else names one.

Request/reply subjects are served by a queue group named after the owning service, so
several instances share the load. Event subjects are plain publish/subscribe. Durable
records (perf, audit events) live in JetStream streams.

Each owning service's section lists what it serves; the message schemas for a subject live
in :mod:`loki_shared.messages` under the same domain name, and :data:`EXCHANGES` pairs each
subject with its request and reply types.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from .messages import (
    chat,
    code,
    engine,
    events,
    mcp,
    memory,
    perf,
    projects,
    recall,
    tasks,
    workspace,
)

PREFIX = "loki"


# --- the table: each subject with its request and reply types --------------------------------
@dataclass(frozen=True)
class Exchange:
    """What travels on one subject: ``request`` (the message sent or published) and
    ``reply`` (the answer's model; None for an event, which has no answer)."""

    subject: str
    request: type[BaseModel]
    reply: type[BaseModel] | None


#: Every fixed subject and its message types, filled by :func:`_exchange` as the sections
#: below declare them: the bus wrappers (``loki_gateway.bus.Bus``, ``loki_chat.bus.ChatBus``)
#: check each request and publish against it. Subjects built per conversation, instance or
#: service (``chat_events``, ``chat_instance``, ``health``) are not in it: a
#: ``ForwardRequest``'s reply is the reply of the subject its ``op`` names.
EXCHANGES: dict[str, Exchange] = {}


def _exchange(subject: str, request: type[BaseModel], reply: type[BaseModel] | None) -> str:
    """Declare ``subject`` with its request type and its reply type (None: an event) in
    :data:`EXCHANGES`; returns ``subject``. Raises ValueError on a subject declared twice."""
    if subject in EXCHANGES:
        raise ValueError(f"{subject} declared twice")
    EXCHANGES[subject] = Exchange(subject, request, reply)
    return subject


# --- chat service (queue group QUEUE_CHAT) -------------------------------------------------
QUEUE_CHAT = "chat"
CHAT_SEND = _exchange("loki.chat.send", chat.SendRequest, chat.SendReply)
# control ops: stop, reset, compact
CHAT_CONTROL = _exchange("loki.chat.control", chat.ControlRequest, chat.ControlReply)
CHAT_STATE = _exchange("loki.chat.state", chat.StateRequest, chat.StateReply)
CHAT_REPLAY = _exchange("loki.chat.replay", chat.ReplayRequest, chat.ReplayReply)
CHAT_CONVERSATIONS = _exchange(
    "loki.chat.conversations", chat.ConversationsRequest, chat.ConversationsReply
)
# the scheduled tasks
CHAT_TASKS = _exchange("loki.chat.tasks", tasks.TasksRequest, tasks.TasksReply)
# the person's MCP servers (list, add, update, delete, test)
CHAT_MCP = _exchange("loki.chat.mcp", mcp.McpRequest, mcp.McpReply)
# a conversation's code mode and acceptance criteria (get, mode, criteria, check)
CHAT_CODE = _exchange("loki.chat.code", code.CodeRequest, code.CodeReply)
CHAT_EVENTS_PREFIX = "loki.chat.events"  # + ".<conversation>": ChatEvent, live display events
CHAT_EVENTS_ALL = "loki.chat.events.*"
CHAT_INSTANCE_PREFIX = "loki.chat.instance"  # + ".<instance>": ForwardRequest -> reply (owner)


def chat_events(conversation: str) -> str:
    """Subject of the live display events of one conversation (``loki.chat.events.<id>``).

    Raises:
        ValueError: the id holds a character that would change the subject (``.``, ``*``,
            ``>``, white space) or is empty.
    """
    if not conversation or any(c in conversation for c in ".*> \t\r\n"):
        raise ValueError(f"conversation id {conversation!r} is not a valid subject token")
    return f"{CHAT_EVENTS_PREFIX}.{conversation}"


def chat_instance(instance: str) -> str:
    """Subject where chat instance ``instance`` serves requests other instances forward to it
    for the conversations it owns (``loki.chat.instance.<id>``, no queue group).

    Raises:
        ValueError: the id is empty or holds ``.``, ``*``, ``>`` or white space.
    """
    if not instance or any(c in instance for c in ".*> \t\r\n"):
        raise ValueError(f"instance id {instance!r} is not a valid subject token")
    return f"{CHAT_INSTANCE_PREFIX}.{instance}"


# --- recall service (queue group QUEUE_RECALL) ---------------------------------------------
QUEUE_RECALL = "recall"
RECALL_ARCHIVE = _exchange("loki.recall.archive", recall.ArchiveRequest, recall.ArchiveReply)
# the recall(id) and recall_search(query) tools
RECALL_TOOL = _exchange("loki.recall.tool", recall.ToolRequest, recall.ToolReply)
RECALL_BLOCK = _exchange("loki.recall.block", recall.BlockRequest, recall.BlockReply)
RECALL_BLOCKS = _exchange("loki.recall.blocks", recall.BlocksRequest, recall.BlocksReply)
RECALL_PURGE = _exchange("loki.recall.purge", recall.PurgeRequest, recall.PurgeReply)

# --- workspace service: each project's workspace and its sandbox (queue group QUEUE_WORKSPACE)
QUEUE_WORKSPACE = "workspace"
WORKSPACE_CREATE = _exchange(
    "loki.workspace.create", workspace.CreateRequest, workspace.WorkspaceReply
)
WORKSPACE_INFO = _exchange("loki.workspace.info", workspace.InfoRequest, workspace.WorkspaceReply)
# list, glob, grep
WORKSPACE_FILES = _exchange("loki.workspace.files", workspace.FilesRequest, workspace.FilesReply)
WORKSPACE_READ = _exchange("loki.workspace.read", workspace.ReadRequest, workspace.ReadReply)
# write, edit
WORKSPACE_WRITE = _exchange("loki.workspace.write", workspace.WriteRequest, workspace.WriteReply)
# a command in the sandbox
WORKSPACE_RUN = _exchange("loki.workspace.run", workspace.RunRequest, workspace.RunReply)
# status, diff, commit, log (in the sandbox)
WORKSPACE_GIT = _exchange("loki.workspace.git", workspace.GitRequest, workspace.RunReply)
# an HTML file rendered by headless chromium in the sandbox
WORKSPACE_PREVIEW = _exchange(
    "loki.workspace.preview", workspace.PreviewRequest, workspace.PreviewReply
)

# --- memory key (the gateway hands the user's memory key to the services) ------------------
# broadcast when the key is set or cleared
MEMORY_KEY = _exchange("loki.memory.key", memory.MemoryKeyEvent, None)
# the gateway answers
MEMORY_STATUS = _exchange(
    "loki.memory.status", memory.MemoryStatusRequest, memory.MemoryStatusReply
)

# --- memory service: projects, memory pages, trackers (queue group QUEUE_PROJECTS) ----------
# (``loki.memory.*`` above is the memory KEY, served by the gateway; these are the contents.)
QUEUE_PROJECTS = "memory"
PROJECTS_PREFIX = "loki.projects"
PROJECTS_LIST = _exchange(
    "loki.projects.list", projects.ProjectsListRequest, projects.ProjectsReply
)
PROJECTS_CREATE = _exchange(
    "loki.projects.create", projects.ProjectCreateRequest, projects.ProjectReply
)
PROJECTS_UPDATE = _exchange(
    "loki.projects.update", projects.ProjectUpdateRequest, projects.ProjectReply
)
PROJECTS_DELETE = _exchange(
    "loki.projects.delete", projects.ProjectDeleteRequest, projects.ProjectDeleteReply
)
PROJECTS_ACTIVE = _exchange(
    "loki.projects.active", projects.ActiveProjectRequest, projects.ProjectReply
)
PROJECTS_ACTIVATE = _exchange(
    "loki.projects.activate", projects.ActivateProjectRequest, projects.ProjectReply
)
PROJECTS_BLOCK = _exchange(
    "loki.projects.block", projects.ProjectBlockRequest, projects.ProjectBlockReply
)
PROJECTS_PAGE_READ = _exchange(
    "loki.projects.page.read", projects.PageReadRequest, projects.PageReply
)
PROJECTS_PAGE_WRITE = _exchange(
    "loki.projects.page.write", projects.PageWriteRequest, projects.PageReply
)
PROJECTS_PAGE_DELETE = _exchange(
    "loki.projects.page.delete", projects.PageDeleteRequest, projects.PageDeleteReply
)
PROJECTS_PAGE_LIST = _exchange(
    "loki.projects.page.list", projects.PageListRequest, projects.PagesReply
)
PROJECTS_PAGE_SEARCH = _exchange(
    "loki.projects.page.search", projects.PageSearchRequest, projects.SearchReply
)
PROJECTS_TRACKER_LOG = _exchange(
    "loki.projects.tracker.log", projects.TrackerLogRequest, projects.TrackerLogReply
)
PROJECTS_TRACKER_READ = _exchange(
    "loki.projects.tracker.read", projects.TrackerReadRequest, projects.TrackerReadReply
)
PROJECTS_TRACKER_LIST = _exchange(
    "loki.projects.tracker.list", projects.TrackerListRequest, projects.TrackersReply
)
PROJECTS_TRACKER_DELETE = _exchange(
    "loki.projects.tracker.delete", projects.TrackerDeleteRequest, projects.TrackerDeleteReply
)
PROJECTS_EXPORT = _exchange("loki.projects.export", projects.ExportRequest, projects.ExportReply)
PROJECTS_IMPORT = _exchange("loki.projects.import", projects.ImportRequest, projects.ProjectReply)
# published after every change
PROJECTS_CHANGED = _exchange("loki.projects.changed", projects.ProjectChangedEvent, None)

# --- engine supervisor (queue group QUEUE_ENGINE) ------------------------------------------
QUEUE_ENGINE = "engine"
ENGINE_INFO = _exchange("loki.engine.info", engine.EngineInfoRequest, engine.EngineInfo)
ENGINE_LEASE = _exchange("loki.engine.lease", engine.LeaseRequest, engine.Lease)
ENGINE_RELEASE = _exchange("loki.engine.release", engine.ReleaseRequest, engine.ReleaseReply)
# extends the lease's TTL
ENGINE_RENEW = _exchange("loki.engine.renew", engine.RenewRequest, engine.Lease)
# an event on every state change
ENGINE_STATE = _exchange("loki.engine.state", engine.EngineState, None)
ENGINE_PRESETS = _exchange("loki.engine.presets", engine.PresetsRequest, engine.PresetsReply)
# a benchmark of the preset
ENGINE_BENCH = _exchange("loki.engine.bench", engine.BenchRequest, engine.BenchReply)
# the launch search
ENGINE_OPTIMISE = _exchange("loki.engine.optimise", engine.OptimiseRequest, engine.OptimiseReply)
# replicated supervisors (LOKI_SUPERVISOR_REPLICATED): a non-leader forwards lease, renew,
# release, info, presets, bench and optimise to the leader's own subject (no queue group;
# same request and reply types as the queue group's subject of the op)
ENGINE_NODE_PREFIX = "loki.engine.node"  # + ".<instance>.<op>"
#: The ops forwarded to the leader, with the queue group subject each one mirrors.
ENGINE_NODE_OPS = {
    "lease": ENGINE_LEASE,
    "renew": ENGINE_RENEW,
    "release": ENGINE_RELEASE,
    "info": ENGINE_INFO,
    "presets": ENGINE_PRESETS,
    "bench": ENGINE_BENCH,
    "optimise": ENGINE_OPTIMISE,
}


def engine_node(instance: str, op: str) -> str:
    """Subject where supervisor ``instance`` serves ``op`` (``lease``, ``renew``, ``release``,
    ``info``, ``presets``, ``bench``, ``optimise``) forwarded by another instance while it leads
    (``loki.engine.node.<instance>.<op>``).

    Raises:
        ValueError: ``op`` is not one of :data:`ENGINE_NODE_OPS`, or ``instance`` is empty or
            holds ``.``, ``*``, ``>`` or white space.
    """
    if op not in ENGINE_NODE_OPS:
        raise ValueError(f"{op!r} is not forwarded to the leader")
    if not instance or any(c in instance for c in ".*> \t\r\n"):
        raise ValueError(f"instance id {instance!r} is not a valid subject token")
    return f"{ENGINE_NODE_PREFIX}.{instance}.{op}"


# --- perf service (queue group QUEUE_PERF) -------------------------------------------------
QUEUE_PERF = "perf"
# kept in the JetStream stream STREAM_PERF
PERF_RECORD = _exchange("loki.perf.record", perf.PerfRecord, None)
PERF_SUMMARY = _exchange("loki.perf.summary", perf.SummaryRequest, perf.PerfSummary)
PERF_LOSSES = _exchange("loki.perf.losses", perf.LossesRequest, perf.LossesReply)
PERF_CACHERAM = _exchange(
    "loki.perf.cacheram", perf.CacheRamAdviceRequest, perf.CacheRamAdviceReply
)
KV_PERF_TOTALS = "LOKI_PERF_TOTALS"  # JetStream key-value bucket: the metrics checkpoint

# --- audit events (JetStream stream STREAM_EVENTS) -----------------------------------------
EVENTS_COMPACTION = _exchange("loki.events.compaction", events.CompactionEvent, None)
EVENTS_ARCHIVE = _exchange("loki.events.archive", events.ArchiveEvent, None)

# --- JetStream streams -------------------------------------------------------------------------
STREAM_PERF = "LOKI_PERF"  # subjects [PERF_RECORD], max 5000 messages (the perf ring)
STREAM_PERF_MAX_MSGS = 5000
STREAM_EVENTS = "LOKI_EVENTS"  # subjects [EVENTS_COMPACTION, EVENTS_ARCHIVE]

# --- health (every service; used by container health checks, see loki_shared.health) ---------
# Every instance of a service answers HEALTH_PREFIX.<service>.<instance> (its own check, no
# queue group) and HEALTH_PREFIX.<service> (queue group QUEUE_HEALTH: "is any instance up").
HEALTH_PREFIX = "loki.health"  # + ".<service>[.<instance>]": HealthRequest -> HealthReply
QUEUE_HEALTH = "health"


def health(service: str, instance: str | None = None) -> str:
    """Subject of the health check of ``service`` (one ``instance`` when given).

    Raises:
        ValueError: a token is empty or holds a character that would change the subject.
    """
    tokens = [service] if instance is None else [service, instance]
    for token in tokens:
        if not token or any(c in token for c in ".*> \t\r\n"):
            raise ValueError(f"{token!r} is not a valid subject token")
    return ".".join([HEALTH_PREFIX, *tokens])


def check(subject: str, message: BaseModel, reply_type: type[BaseModel] | None = None) -> None:
    """Check ``message`` (and the ``reply_type`` it is to be answered with, when given)
    against :data:`EXCHANGES`' row for ``subject``; a subject not in the table passes.

    Raises:
        TypeError: ``message`` is not the subject's request type, or ``reply_type`` is not
            its reply type (a programming error: the sender and the server would disagree).
    """
    row = EXCHANGES.get(subject)
    if row is None:
        return
    if not isinstance(message, row.request):
        raise TypeError(f"{subject} carries {row.request.__name__}, not {type(message).__name__}")
    if reply_type is not None and reply_type is not row.reply:
        expected = row.reply.__name__ if row.reply is not None else "no reply (an event)"
        raise TypeError(f"{subject} is answered with {expected}, not {reply_type.__name__}")
