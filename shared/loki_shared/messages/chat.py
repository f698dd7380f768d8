"""Messages of the chat service (``loki.chat.*``) and the OpenAI-shaped chat types it stores."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .base import Msg, Reply


class ToolCallFunction(Msg):
    """OpenAI ``tool_calls[].function``: ``arguments`` is the JSON text as the model wrote it."""

    name: str
    arguments: str = ""


class ToolCall(Msg):
    """OpenAI ``tool_calls[]`` item of an assistant message."""

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


#: ``loki.injected`` values of the reminders Loki injects in a turn (the canonical list):
#: ``budget`` (last step), ``act`` (reasoning only), ``verify`` (the verifier's corrective
#: round), ``criteria`` (code mode's corrective round, issue 43). One left unanswered is
#: removed before the conversation is persisted (the turn's end, a takeover after a crash);
#: compaction never starts a tail on one.
REMINDER_KINDS = ("budget", "act", "verify", "criteria")


class LokiMeta(Msg):
    """Loki's own marks on a stored message; never sent to the engine.

    - ``injected``: the message was written by Loki, not the user (a reminder of
      :data:`REMINDER_KINDS`, ``"summary"``, ...). This field, never a text prefix, is how an
      injected message is recognised.
    - ``stopped`` / ``error``: the assistant message was cut by a stop or an error.
    - ``sent_after``: on a summary installed with COMPACT_TAIL_REUSE on, how many of the
      messages that follow it are sent before it (the verbatim tail keeps its place after the
      system prompt; ``loki_chat.compaction.layout``). None: sent where it is stored.
    """

    injected: str | None = None
    stopped: bool = False
    error: str | None = None
    sent_after: int | None = None


class ChatMessage(Msg):
    """One message of the model view (OpenAI ``messages[]`` item plus Loki's marks).

    ``content`` is text, a list of OpenAI content parts, or None (an assistant message that
    only calls tools). ``reasoning_content`` is llama.cpp's separated reasoning, kept only
    with ``REASONING_ECHO``; ``reasoning_model`` names the model that wrote it.
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None
    reasoning_model: str | None = None
    loki: LokiMeta | None = None


class ChatEvent(Msg):
    """One entry of a conversation's display log, also published live on
    ``loki.chat.events.<conversation>`` (the same object is stored and published, so replay
    and live events never gap nor repeat: a client subscribes first, replays after its last
    seq, and drops seqs it already has).

    ``seq`` starts at 1 and increases by one per event of the conversation (a reset empties
    the log, seq goes on); it is the SSE ``id``. ``ts`` is a Unix time in seconds.

    Shapes (``delta`` uses OpenAI delta keys; ``loki.event`` names Loki's own events):

    - user message: ``delta={"role": "user", "content": text}``, ``loki={"event": "user"}``;
    - reminder Loki injected: ``delta={"role": "user", "content": text}`` when stored (or
      ``{}`` when sent once at the end of the user's message), ``loki={"event": "reminder",
      "injected": "budget" | "act" | "verify", "stored": bool}``;
    - assistant deltas: ``delta`` with ``content``, ``reasoning_content`` and/or
      ``tool_calls`` (``[{"index", "id"?, "type"?, "function": {"name"?, "arguments"?}}]``,
      fragments as streamed); the first delta of each completion step also carries
      ``"role": "assistant"``; ``loki`` is None;
    - tool result: ``delta={"role": "tool", "tool_call_id", "name", "content"}`` with the
      WHOLE result (the model's view may be cut), ``loki={"event": "tool_result"}``;
    - end of turn: ``delta={}``, ``finish_reason`` (``stop``, ``length``, ``stopped``,
      ``error``, ``step_budget``), ``usage`` and ``timings`` of the turn's last completion,
      ``loki={"event": "turn_end", "steps", "ctx_used", "stopped"?, "error"?,
      "interrupted"?}``;
    - others (``delta={}``): ``loki.event`` = ``"retry"`` (``attempt``, ``delay_s``,
      ``reason``), ``"stopped"`` / ``"error"`` (the step's partial reply was kept and marked;
      ``message``), ``"discarded"`` (an answer replaced by a replay), ``"reset"``, and the
      compaction markers the compaction policy adds;
    - the verifier's verdict: ``loki={"event": "verify", "verdict": "pass" | "fail",
      "reason", "malformed"?}`` (a fail is followed by a ``verify`` reminder);
    - a sub-agent's own events, nested under its tool call: ``delta={}``,
      ``loki={"event": "subagent", "tool_call_id", "inner": {"delta", ...}}`` (``inner``
      has the shape of a display event without ``seq``/``ts``).
    """

    conversation: str
    seq: int
    ts: float
    delta: dict[str, Any] = Field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    loki: dict[str, Any] | None = None
    #: set on an event that stands for a merged run of text deltas
    #: (:func:`loki_shared.chat_log.coalesce`): the seq of the first event it absorbed.
    merged_from: int | None = None

    def sse_data(self) -> dict[str, Any]:
        """The SSE ``data`` object: ``{"seq", "ts", "choices": [{"index": 0, "delta",
        "finish_reason"}]}`` plus ``usage``, ``timings``, ``loki`` and ``merged_from`` when
        set."""
        data: dict[str, Any] = {
            "seq": self.seq,
            "ts": self.ts,
            "choices": [{"index": 0, "delta": self.delta, "finish_reason": self.finish_reason}],
        }
        if self.usage is not None:
            data["usage"] = self.usage
        if self.timings is not None:
            data["timings"] = self.timings
        if self.loki is not None:
            data["loki"] = self.loki
        if self.merged_from is not None:
            data["merged_from"] = self.merged_from
        return data


class ForwardRequest(Msg):
    """``loki.chat.instance.<id>``: a request another chat instance forwards to the owner of
    a conversation. ``op`` is ``send``, ``control``, ``state``, ``replay`` or
    ``conversations``; ``payload`` the original request; the reply is the op's reply."""

    op: str
    payload: dict[str, Any] = Field(default_factory=dict)


class ImageAttachment(Msg):
    """An image sent with a user message: ``id`` (the attachment's), ``name`` (the file
    name the user gave), ``url`` (a ``data:image/<type>;base64,...`` URL: what the model gets
    as an OpenAI ``image_url`` part in the turn it arrives, never kept in the history).

    Only a ``data:image/`` URL is valid: no remote URL reaches the engine (which would fetch
    it, with no address check: issue 38), so a request carrying one is ``invalid_request``
    before any turn starts; the images ``see_image`` shows are these, kept."""

    id: str
    name: str
    url: str = Field(pattern=r"^(?i:data:image/)")


class SendRequest(Msg):
    """``loki.chat.send``: a user message. No ``conversation`` creates a new one.

    ``images``: images attached to the message (the gateway checked that the engine sees
    images); text files are already inlined in ``content`` as fenced blocks."""

    conversation: str | None = None
    content: str
    images: list[ImageAttachment] = Field(default_factory=list)


class SendReply(Reply):
    """The conversation id, and whether the message waits behind a running turn."""

    conversation: str = ""
    queued: bool = False


class ControlRequest(Msg):
    """``loki.chat.control``: stop the running turn, reset the conversation, compact it,
    continue its last assistant reply (Continue after a reply cut at ``max_tokens``), or
    ``cancel_queued``: drop the queued user message whose text is ``content`` (one that has
    not started; a started one is never cancelled)."""

    conversation: str
    action: Literal["stop", "reset", "compact", "continue", "cancel_queued"]
    content: str | None = None


class ControlReply(Reply):
    ok: bool = False
    detail: str = ""


class StateRequest(Msg):
    """``loki.chat.state``."""

    conversation: str


class StateReply(Reply):
    """Model-view messages, context use (tokens) and whether a turn runs.

    ``pending``: the texts of the user messages queued behind the running turn, in the order
    they will run (``queued`` is their count); a page shows them again after a reload.

    ``tools_unavailable``: the tools the last step could not offer and why, as
    ``{"tools": [names], "model", "reason"}`` (the model's chat template drops them, per the
    engine's template probe); None when they were offered or no step ran on this owner.
    """

    conversation: str = ""
    messages: list[ChatMessage] = Field(default_factory=list)
    ctx_used: int = 0
    n_ctx: int | None = None
    generating: bool = False
    queued: int = 0
    pending: list[str] = Field(default_factory=list)
    last_seq: int = 0
    tools_unavailable: dict[str, Any] | None = None


class ReplayRequest(Msg):
    """``loki.chat.replay``: display events with ``seq > after_seq``, at most ``limit``.

    Paged history (a long conversation opened in the browser): with ``turns`` set, the reply
    is the events of the last ``turns`` turns before ``before_seq`` (None: the end of the
    log), starting at a turn's first event (its user message), ``after_seq`` and ``limit``
    unused; ``older`` in the reply says whether events before the page exist.
    """

    conversation: str
    after_seq: int = 0
    limit: int | None = None
    turns: int | None = Field(default=None, ge=1, le=1000)
    before_seq: int | None = Field(default=None, ge=1)


class ReplayReply(Reply):
    """``events`` in increasing seq; ``more`` is true when ``limit`` cut the list; ``older``
    (paged history) is true when events before the first one returned exist."""

    events: list[ChatEvent] = Field(default_factory=list)
    last_seq: int = 0
    more: bool = False
    older: bool = False


#: What a conversation is: a person's (``main``) or a scheduled task's run (``task``).
ConversationKind = Literal["main", "task"]


class ConversationInfo(Msg):
    """A conversation in a list; ``project`` is the project it belongs to (the one active
    when it was created; None: the default project); ``kind``: ``main`` (a person's) or
    ``task`` (a scheduled task's run, reached from its task's runs)."""

    id: str
    title: str = ""
    created: float = 0.0
    updated: float = 0.0
    project: str | None = None
    kind: ConversationKind = "main"


class ConversationsRequest(Msg):
    """``loki.chat.conversations``: list, create, rename, delete or export."""

    action: Literal["list", "create", "rename", "delete", "export"]
    conversation: str | None = None
    title: str | None = None
    #: ``create``: the project the new conversation belongs to (the gateway sends the active
    #: one; None: the default project). ``list``: only that project's conversations (None:
    #: all). The others ignore it.
    project: str | None = None
    #: ``list``: only conversations of that kind (None: all; an index entry written before
    #: kinds were listed counts as ``main``). The others ignore it.
    kind: ConversationKind | None = None


class ConversationsReply(Reply):
    conversations: list[ConversationInfo] = Field(default_factory=list)
    conversation: ConversationInfo | None = None
    export: dict[str, Any] | None = None
