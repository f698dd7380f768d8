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

from .messages import chat, engine, events, memory, perf, projects, recall, tasks

PREFIX = "loki"

# --- chat service (queue group QUEUE_CHAT) -------------------------------------------------
QUEUE_CHAT = "chat"
CHAT_SEND = "loki.chat.send"  # SendRequest -> SendReply
CHAT_CONTROL = "loki.chat.control"  # ControlRequest -> ControlReply (stop, reset, compact)
CHAT_STATE = "loki.chat.state"  # StateRequest -> StateReply
CHAT_REPLAY = "loki.chat.replay"  # ReplayRequest -> ReplayReply
CHAT_CONVERSATIONS = "loki.chat.conversations"  # ConversationsRequest -> ConversationsReply
CHAT_TASKS = "loki.chat.tasks"  # TasksRequest -> TasksReply (scheduled tasks)
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
RECALL_ARCHIVE = "loki.recall.archive"  # ArchiveRequest -> ArchiveReply
RECALL_TOOL = "loki.recall.tool"  # ToolRequest -> ToolReply (recall, recall_search)
RECALL_BLOCK = "loki.recall.block"  # BlockRequest -> BlockReply
RECALL_BLOCKS = "loki.recall.blocks"  # BlocksRequest -> BlocksReply
RECALL_PURGE = "loki.recall.purge"  # PurgeRequest -> PurgeReply

# --- memory key (the gateway hands the user's memory key to the services) ------------------
MEMORY_KEY = "loki.memory.key"  # MemoryKeyEvent, broadcast (set or cleared)
MEMORY_STATUS = "loki.memory.status"  # MemoryStatusRequest -> MemoryStatusReply (gateway answers)

# --- memory service: projects, memory pages, trackers (queue group QUEUE_PROJECTS) ----------
# (``loki.memory.*`` above is the memory KEY, served by the gateway; these are the contents.)
QUEUE_PROJECTS = "memory"
PROJECTS_PREFIX = "loki.projects"
PROJECTS_LIST = "loki.projects.list"  # ProjectsListRequest -> ProjectsReply
PROJECTS_CREATE = "loki.projects.create"  # ProjectCreateRequest -> ProjectReply
PROJECTS_UPDATE = "loki.projects.update"  # ProjectUpdateRequest -> ProjectReply
PROJECTS_DELETE = "loki.projects.delete"  # ProjectDeleteRequest -> ProjectDeleteReply
PROJECTS_ACTIVE = "loki.projects.active"  # ActiveProjectRequest -> ProjectReply
PROJECTS_ACTIVATE = "loki.projects.activate"  # ActivateProjectRequest -> ProjectReply
PROJECTS_BLOCK = "loki.projects.block"  # ProjectBlockRequest -> ProjectBlockReply
PROJECTS_PAGE_READ = "loki.projects.page.read"  # PageReadRequest -> PageReply
PROJECTS_PAGE_WRITE = "loki.projects.page.write"  # PageWriteRequest -> PageReply
PROJECTS_PAGE_DELETE = "loki.projects.page.delete"  # PageDeleteRequest -> PageDeleteReply
PROJECTS_PAGE_LIST = "loki.projects.page.list"  # PageListRequest -> PagesReply
PROJECTS_PAGE_SEARCH = "loki.projects.page.search"  # PageSearchRequest -> SearchReply
PROJECTS_TRACKER_LOG = "loki.projects.tracker.log"  # TrackerLogRequest -> TrackerLogReply
PROJECTS_TRACKER_READ = "loki.projects.tracker.read"  # TrackerReadRequest -> TrackerReadReply
PROJECTS_TRACKER_LIST = "loki.projects.tracker.list"  # TrackerListRequest -> TrackersReply
PROJECTS_TRACKER_DELETE = "loki.projects.tracker.delete"  # TrackerDeleteRequest -> ...Reply
PROJECTS_EXPORT = "loki.projects.export"  # ExportRequest -> ExportReply
PROJECTS_IMPORT = "loki.projects.import"  # ImportRequest -> ProjectReply
PROJECTS_CHANGED = "loki.projects.changed"  # ProjectChangedEvent, after every change

# --- engine supervisor (queue group QUEUE_ENGINE) ------------------------------------------
QUEUE_ENGINE = "engine"
ENGINE_INFO = "loki.engine.info"  # EngineInfoRequest -> EngineInfo
ENGINE_LEASE = "loki.engine.lease"  # LeaseRequest -> Lease
ENGINE_RELEASE = "loki.engine.release"  # ReleaseRequest -> ReleaseReply
ENGINE_RENEW = "loki.engine.renew"  # RenewRequest -> Lease (extends the lease's TTL)
ENGINE_STATE = "loki.engine.state"  # EngineState, event on every state change
ENGINE_PRESETS = "loki.engine.presets"  # PresetsRequest -> PresetsReply
ENGINE_BENCH = "loki.engine.bench"  # BenchRequest -> BenchReply (benchmark of the preset)
ENGINE_OPTIMISE = "loki.engine.optimise"  # OptimiseRequest -> OptimiseReply (launch search)

# --- perf service (queue group QUEUE_PERF) -------------------------------------------------
QUEUE_PERF = "perf"
PERF_RECORD = "loki.perf.record"  # PerfRecord, JetStream stream STREAM_PERF
PERF_SUMMARY = "loki.perf.summary"  # SummaryRequest -> PerfSummary
PERF_LOSSES = "loki.perf.losses"  # LossesRequest -> LossesReply
PERF_CACHERAM = "loki.perf.cacheram"  # CacheRamAdviceRequest -> CacheRamAdviceReply
KV_PERF_TOTALS = "LOKI_PERF_TOTALS"  # JetStream key-value bucket: the metrics checkpoint

# --- audit events (JetStream stream STREAM_EVENTS) -----------------------------------------
EVENTS_COMPACTION = "loki.events.compaction"  # CompactionEvent
EVENTS_ARCHIVE = "loki.events.archive"  # ArchiveEvent

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


# --- the table: each subject with its request and reply types --------------------------------
@dataclass(frozen=True)
class Exchange:
    """What travels on one subject: ``request`` (the message sent or published) and
    ``reply`` (the answer's model; None for an event, which has no answer)."""

    subject: str
    request: type[BaseModel]
    reply: type[BaseModel] | None


def _table(*rows: Exchange) -> dict[str, Exchange]:
    return {row.subject: row for row in rows}


#: Every fixed subject and its message types: the bus wrappers (``loki_gateway.bus.Bus``,
#: ``loki_chat.bus.ChatBus``) check each request and publish against it. Subjects built per
#: conversation, instance or service (``chat_events``, ``chat_instance``, ``health``) are not
#: in it: a ``ForwardRequest``'s reply is the reply of the subject its ``op`` names.
EXCHANGES: dict[str, Exchange] = _table(
    Exchange(CHAT_SEND, chat.SendRequest, chat.SendReply),
    Exchange(CHAT_CONTROL, chat.ControlRequest, chat.ControlReply),
    Exchange(CHAT_STATE, chat.StateRequest, chat.StateReply),
    Exchange(CHAT_REPLAY, chat.ReplayRequest, chat.ReplayReply),
    Exchange(CHAT_CONVERSATIONS, chat.ConversationsRequest, chat.ConversationsReply),
    Exchange(CHAT_TASKS, tasks.TasksRequest, tasks.TasksReply),
    Exchange(RECALL_ARCHIVE, recall.ArchiveRequest, recall.ArchiveReply),
    Exchange(RECALL_TOOL, recall.ToolRequest, recall.ToolReply),
    Exchange(RECALL_BLOCK, recall.BlockRequest, recall.BlockReply),
    Exchange(RECALL_BLOCKS, recall.BlocksRequest, recall.BlocksReply),
    Exchange(RECALL_PURGE, recall.PurgeRequest, recall.PurgeReply),
    Exchange(MEMORY_KEY, memory.MemoryKeyEvent, None),
    Exchange(MEMORY_STATUS, memory.MemoryStatusRequest, memory.MemoryStatusReply),
    Exchange(PROJECTS_LIST, projects.ProjectsListRequest, projects.ProjectsReply),
    Exchange(PROJECTS_CREATE, projects.ProjectCreateRequest, projects.ProjectReply),
    Exchange(PROJECTS_UPDATE, projects.ProjectUpdateRequest, projects.ProjectReply),
    Exchange(PROJECTS_DELETE, projects.ProjectDeleteRequest, projects.ProjectDeleteReply),
    Exchange(PROJECTS_ACTIVE, projects.ActiveProjectRequest, projects.ProjectReply),
    Exchange(PROJECTS_ACTIVATE, projects.ActivateProjectRequest, projects.ProjectReply),
    Exchange(PROJECTS_BLOCK, projects.ProjectBlockRequest, projects.ProjectBlockReply),
    Exchange(PROJECTS_PAGE_READ, projects.PageReadRequest, projects.PageReply),
    Exchange(PROJECTS_PAGE_WRITE, projects.PageWriteRequest, projects.PageReply),
    Exchange(PROJECTS_PAGE_DELETE, projects.PageDeleteRequest, projects.PageDeleteReply),
    Exchange(PROJECTS_PAGE_LIST, projects.PageListRequest, projects.PagesReply),
    Exchange(PROJECTS_PAGE_SEARCH, projects.PageSearchRequest, projects.SearchReply),
    Exchange(PROJECTS_TRACKER_LOG, projects.TrackerLogRequest, projects.TrackerLogReply),
    Exchange(PROJECTS_TRACKER_READ, projects.TrackerReadRequest, projects.TrackerReadReply),
    Exchange(PROJECTS_TRACKER_LIST, projects.TrackerListRequest, projects.TrackersReply),
    Exchange(PROJECTS_TRACKER_DELETE, projects.TrackerDeleteRequest, projects.TrackerDeleteReply),
    Exchange(PROJECTS_EXPORT, projects.ExportRequest, projects.ExportReply),
    Exchange(PROJECTS_IMPORT, projects.ImportRequest, projects.ProjectReply),
    Exchange(PROJECTS_CHANGED, projects.ProjectChangedEvent, None),
    Exchange(ENGINE_INFO, engine.EngineInfoRequest, engine.EngineInfo),
    Exchange(ENGINE_LEASE, engine.LeaseRequest, engine.Lease),
    Exchange(ENGINE_RELEASE, engine.ReleaseRequest, engine.ReleaseReply),
    Exchange(ENGINE_RENEW, engine.RenewRequest, engine.Lease),
    Exchange(ENGINE_STATE, engine.EngineState, None),
    Exchange(ENGINE_PRESETS, engine.PresetsRequest, engine.PresetsReply),
    Exchange(ENGINE_BENCH, engine.BenchRequest, engine.BenchReply),
    Exchange(ENGINE_OPTIMISE, engine.OptimiseRequest, engine.OptimiseReply),
    Exchange(PERF_RECORD, perf.PerfRecord, None),
    Exchange(PERF_SUMMARY, perf.SummaryRequest, perf.PerfSummary),
    Exchange(PERF_LOSSES, perf.LossesRequest, perf.LossesReply),
    Exchange(PERF_CACHERAM, perf.CacheRamAdviceRequest, perf.CacheRamAdviceReply),
    Exchange(EVENTS_COMPACTION, events.CompactionEvent, None),
    Exchange(EVENTS_ARCHIVE, events.ArchiveEvent, None),
)


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
