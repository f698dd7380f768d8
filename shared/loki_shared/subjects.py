"""Every NATS subject, queue group and JetStream stream Loki uses. Nowhere else names one.

Request/reply subjects are served by a queue group named after the owning service, so
several instances share the load. Event subjects are plain publish/subscribe. Durable
records (perf, audit events) live in JetStream streams.

Each owning service's section lists what it serves; the message schemas for a subject live
in :mod:`loki_shared.messages` under the same domain name.
"""

from __future__ import annotations

PREFIX = "loki"

# --- chat service (queue group QUEUE_CHAT) -------------------------------------------------
QUEUE_CHAT = "chat"
CHAT_SEND = "loki.chat.send"  # SendRequest -> SendReply
CHAT_CONTROL = "loki.chat.control"  # ControlRequest -> ControlReply (stop, reset, compact)
CHAT_STATE = "loki.chat.state"  # StateRequest -> StateReply
CHAT_REPLAY = "loki.chat.replay"  # ReplayRequest -> ReplayReply
CHAT_CONVERSATIONS = "loki.chat.conversations"  # ConversationsRequest -> ConversationsReply
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

# --- memory key (the gateway hands the user's memory key to the services) ------------------
MEMORY_KEY = "loki.memory.key"  # MemoryKeyEvent, broadcast (set or cleared)
MEMORY_STATUS = "loki.memory.status"  # MemoryStatusRequest -> MemoryStatusReply (gateway answers)

# --- engine supervisor (queue group QUEUE_ENGINE) ------------------------------------------
QUEUE_ENGINE = "engine"
ENGINE_INFO = "loki.engine.info"  # EngineInfoRequest -> EngineInfo
ENGINE_LEASE = "loki.engine.lease"  # LeaseRequest -> Lease
ENGINE_RELEASE = "loki.engine.release"  # ReleaseRequest -> ReleaseReply
ENGINE_RENEW = "loki.engine.renew"  # RenewRequest -> Lease (extends the lease's TTL)
ENGINE_STATE = "loki.engine.state"  # EngineState, event on every state change
ENGINE_PRESETS = "loki.engine.presets"  # PresetsRequest -> PresetsReply

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
