"""Fakes of the gateway's NATS peers, on a real NATS server, for gateway tests.

:class:`FakePeers` runs in a background thread with its own event loop and answers:

- the chat service's subjects (``loki.chat.send/control/state/replay/conversations``) with an
  in-memory conversation store whose display log and live events follow the real contract
  (log appended first, then the event published on ``loki.chat.events.<id>``);
- the recall service's ``loki.recall.blocks`` (an empty archive);
- the engine supervisor's ``loki.engine.info/lease/renew/release``, pointing at
  ``engine_url`` (the real llama-server or the scripted fake engine) and counting leases;
- its ``loki.engine.presets`` (list/get/save/delete/switch/test/cacheram) on an in-memory
  store, with the supervisor's own validation (:func:`loki_supervisor.presets.validate`) and
  key hiding (:func:`~loki_supervisor.presets.public`); ``engine_failure`` (a dict of
  :class:`EngineInfo` fields) makes ``info`` answer ``failed`` until the next switch.

A "turn" plays ``reply_pieces`` as content deltas, ``delay_s`` apart, then an end-of-turn
event with ``finish_reason``, ``usage`` and ``timings``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats

from loki_shared import subjects
from loki_shared.chat_log import history_page
from loki_shared.errors import InvalidRequest, LokiError, NotFound
from loki_shared.messages.base import ErrorInfo
from loki_shared.messages.chat import (
    ChatEvent,
    ChatMessage,
    ControlReply,
    ControlRequest,
    ConversationInfo,
    ConversationsReply,
    ConversationsRequest,
    ReplayReply,
    ReplayRequest,
    SendReply,
    SendRequest,
    StateReply,
    StateRequest,
)
from loki_shared.messages.engine import (
    EngineInfo,
    LeaseRequest,
    Preset,
    PresetsReply,
    PresetsRequest,
    ReleaseRequest,
    RenewRequest,
)
from loki_shared.messages.perf import PerfRecord
from loki_shared.messages.recall import BlocksReply, BlocksRequest
from loki_supervisor.model_files import list_model_files
from loki_supervisor.presets import public, validate
from tests.fakes.fake_supervisor import FakeSupervisor, responder


@dataclass
class Conv:
    info: ConversationInfo
    events: list[ChatEvent] = field(default_factory=list)
    messages: list[ChatMessage] = field(default_factory=list)
    generating: bool = False
    stop: bool = False
    deleted_blob: bool = False
    pending: list[str] = field(default_factory=list)  # sends waiting behind the running turn
    turns: asyncio.Lock = field(default_factory=asyncio.Lock)  # one turn at a time, FIFO


def _supervisor_field(name: str) -> Any:
    """A read-write attribute of the peers that is ``name`` on their fake supervisor."""
    return property(
        lambda self: getattr(self.supervisor, name),
        lambda self, value: setattr(self.supervisor, name, value),
    )


class FakePeers:
    """Fake chat service and engine supervisor (see the module docstring)."""

    engine_url = _supervisor_field("base_url")
    id_slot = _supervisor_field("id_slot")
    api_key = _supervisor_field("api_key")
    lease_ttl_s = _supervisor_field("ttl_s")
    lease_error = _supervisor_field("refuse")
    leases = _supervisor_field("live")
    lease_count = _supervisor_field("granted")
    release_count = _supervisor_field("release_count")
    renew_count = _supervisor_field("renew_count")

    def __init__(self, nats_url: str, engine_url: str = "", id_slot: int | None = 1) -> None:
        self.nats_url = nats_url
        self.supervisor = FakeSupervisor(
            base_url=engine_url,
            model="fake",
            id_slot=id_slot,
            total_slots=2,
            ttl_s=30.0,
            lease_prefix="L",
            refuse_message="no lease for you",
            info_stopped_without_url=True,
        )
        self.convs: dict[str, Conv] = {}
        self.reply_pieces: list[str] = ["Hello", ", ", "wörld", " 🌍", "!"]
        self.reasoning_pieces: list[str] = []
        # display events ``(delta, extra fields)`` a turn plays after its turn start, before
        # the reply pieces (a tool call, a sub-agent's nested events, a verdict...)
        self.turn_events: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.delay_s = 0.01
        self.skip_publish: set[int] = set()  # seqs appended to the log but not published
        # what ``compact`` answers, and how long it takes (a summary completion)
        self.compact_reply: tuple[bool, str] = (True, "compact")
        self.compact_delay_s = 0.0
        self.state_n_ctx: int | None = 4096  # None: the chat service does not know it yet
        self.perf_records: list[PerfRecord] = []
        self.sends: list[SendRequest] = []  # every send received, in order
        # the presets (id -> Preset, keys kept in clear here) and the active one's id
        self.presets: dict[str, Preset] = {"env": Preset(id="env", name="env")}
        self.active_preset = "env"
        self.switches: list[str] = []  # every switch asked, in order
        self.switch_refusal: str | None = None  # a switch is refused with this message
        self.model_dirs: list[Path] = []  # LOKI_MODEL_DIRS of the ``models`` action
        self.engine_failure: dict[str, Any] | None = None  # info answers "failed" with these
        # what a connection test answers (the supervisor's ``detail``)
        self.test_reply: dict[str, Any] = {"ok": True, "status": 200, "message": "", "models": []}
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.nc: Any = None

    # -- life ---------------------------------------------------------------------------
    def start(self) -> FakePeers:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake peers did not start")
        return self

    def stop(self) -> None:
        self.call(self.nc.drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run ``coro`` on the fakes' loop from any thread and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._connect())
        self._ready.set()
        self.loop.run_forever()

    async def _connect(self) -> None:
        self.nc = await nats.connect(self.nats_url, name="fake-peers")
        table = {
            subjects.CHAT_SEND: (SendRequest, self._send),
            subjects.CHAT_CONTROL: (ControlRequest, self._control),
            subjects.CHAT_STATE: (StateRequest, self._state),
            subjects.CHAT_REPLAY: (ReplayRequest, self._replay),
            subjects.CHAT_CONVERSATIONS: (ConversationsRequest, self._conversations),
            subjects.RECALL_BLOCKS: (BlocksRequest, self._blocks),
            subjects.ENGINE_INFO: (None, self._info),
            subjects.ENGINE_PRESETS: (PresetsRequest, self._presets),
            subjects.ENGINE_LEASE: (LeaseRequest, self.supervisor.lease),
            subjects.ENGINE_RENEW: (RenewRequest, self.supervisor.renew),
            subjects.ENGINE_RELEASE: (ReleaseRequest, self.supervisor.release),
        }
        for subject, (model, handler) in table.items():
            await self.nc.subscribe(subject, cb=self._wrap(model, handler))

        async def on_perf(msg: Any) -> None:
            self.perf_records.append(PerfRecord.model_validate_json(msg.data))

        await self.nc.subscribe(subjects.PERF_RECORD, cb=on_perf)
        await self.nc.flush()

    def _wrap(self, model: Any, handler: Any) -> Any:
        return responder(model, handler)

    # -- chat ---------------------------------------------------------------------------
    def new_conv(self, title: str = "") -> Conv:
        cid = uuid.uuid4().hex[:12]
        now = time.time()
        conv = Conv(ConversationInfo(id=cid, title=title, created=now, updated=now))
        self.convs[cid] = conv
        return conv

    async def emit(self, cid: str, delta: dict[str, Any], **extra: Any) -> ChatEvent:
        """Append one event to the log, then publish it (unless its seq is in skip_publish)."""
        conv = self.convs[cid]
        event = ChatEvent(
            conversation=cid, seq=len(conv.events) + 1, ts=time.time(), delta=delta, **extra
        )
        conv.events.append(event)
        if event.seq not in self.skip_publish:
            await self.nc.publish(subjects.chat_events(cid), event.model_dump_json().encode())
        return event

    async def play_turn(self, cid: str, content: str, images: list[Any] | None = None) -> None:
        conv = self.convs[cid]
        conv.generating = True
        conv.stop = False
        conv.messages.append(ChatMessage(role="user", content=content))
        if images:  # as turn.py: the display event names the images (thumbnails by id)
            meta = {"event": "user", "images": [{"id": i.id, "name": i.name} for i in images]}
            await self.emit(cid, {"role": "user", "content": content}, loki=meta)
        else:
            await self.emit(cid, {"role": "user", "content": content})
        await self.emit(cid, {"role": "assistant"}, loki={"event": "turn_start"})
        for delta, extra in self.turn_events:
            await asyncio.sleep(self.delay_s)
            await self.emit(cid, delta, **extra)
        text = ""
        for piece in self.reasoning_pieces:
            await asyncio.sleep(self.delay_s)
            await self.emit(cid, {"reasoning_content": piece})
        for piece in self.reply_pieces:
            if conv.stop:
                break
            await asyncio.sleep(self.delay_s)
            text += piece
            await self.emit(cid, {"content": piece})
        finish = "stop"
        conv.messages.append(ChatMessage(role="assistant", content=text))
        await self.emit(
            cid,
            {},
            finish_reason=finish,
            usage={"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45},
            timings={"prompt_n": 12, "cache_n": 28, "predicted_n": 5},
            loki={"event": "stopped" if conv.stop else "turn_end"},
        )
        conv.generating = False

    async def _send(self, req: SendRequest) -> SendReply:
        self.sends.append(req)
        if req.conversation is None:
            conv = self.new_conv((req.content.strip().splitlines() or [""])[0][:60])  # as turn.py
        elif req.conversation not in self.convs:
            return SendReply(error=ErrorInfo(type="not_found", message="no such conversation"))
        else:
            conv = self.convs[req.conversation]
        queued = conv.generating or conv.turns.locked()
        conv.pending.append(req.content)

        async def queued_turn() -> None:
            async with conv.turns:  # like the chat service: a send during a turn runs after it
                if req.content not in conv.pending:
                    return  # cancelled while it waited
                conv.pending.remove(req.content)
                await self.play_turn(conv.info.id, req.content, req.images)

        asyncio.get_running_loop().create_task(queued_turn())
        return SendReply(conversation=conv.info.id, queued=queued)

    async def _control(self, req: ControlRequest) -> ControlReply:
        conv = self.convs.get(req.conversation)
        if conv is None:
            return ControlReply(error=ErrorInfo(type="not_found", message="no such conversation"))
        if req.action == "cancel_queued":  # as the chat service: only a message still waiting
            if req.content in conv.pending and (conv.generating or conv.turns.locked()):
                conv.pending.remove(req.content)
                return ControlReply(ok=True, detail="cancelled")
            return ControlReply(ok=False, detail="not queued: its turn already started")
        if req.action == "stop":
            conv.stop = True
        elif req.action == "reset":
            conv.messages.clear()
            await self.emit(req.conversation, {}, loki={"event": "reset"})
        elif req.action == "compact":
            await asyncio.sleep(self.compact_delay_s)
            ok, detail = self.compact_reply
            if ok:
                await self.emit(
                    req.conversation,
                    {},
                    loki={"event": "compaction", "tokens_before": 100, "tokens_after": 20},
                )
            return ControlReply(ok=ok, detail=detail)
        return ControlReply(ok=True, detail=req.action)

    async def _state(self, req: StateRequest) -> StateReply:
        conv = self.convs.get(req.conversation)
        if conv is None:
            return StateReply(error=ErrorInfo(type="not_found", message="no such conversation"))
        return StateReply(
            conversation=conv.info.id,
            messages=conv.messages,
            ctx_used=45,
            n_ctx=self.state_n_ctx,
            generating=conv.generating,
            queued=len(conv.pending),
            pending=list(conv.pending) if conv.generating or conv.turns.locked() else [],
            last_seq=len(conv.events),
        )

    async def _replay(self, req: ReplayRequest) -> ReplayReply:
        conv = self.convs.get(req.conversation)
        if conv is None:
            return ReplayReply(error=ErrorInfo(type="not_found", message="no such conversation"))
        if req.turns is not None:  # paged history: the real rule
            page, older = history_page(conv.events, req.turns, req.before_seq)
            return ReplayReply(events=page, last_seq=len(conv.events), older=older)
        events = [e for e in conv.events if e.seq > req.after_seq]
        more = False
        if req.limit is not None and len(events) > req.limit:
            events, more = events[: req.limit], True
        # Like the real service: a page stays well under NATS's 1 MiB max payload.
        size, cut = 0, len(events)
        for i, e in enumerate(events):
            size += len(e.model_dump_json())
            if size > 512 * 1024 and i > 0:
                cut = i
                break
        if cut < len(events):
            events, more = events[:cut], True
        return ReplayReply(events=events, last_seq=len(conv.events), more=more)

    async def _conversations(self, req: ConversationsRequest) -> ConversationsReply:
        if req.action == "list":
            infos = sorted((c.info for c in self.convs.values()), key=lambda i: -i.updated)
            return ConversationsReply(conversations=infos)
        if req.action == "create":
            return ConversationsReply(conversation=self.new_conv(req.title or "").info)
        conv = self.convs.get(req.conversation or "")
        if conv is None:
            return ConversationsReply(
                error=ErrorInfo(type="not_found", message="no such conversation")
            )
        if req.action == "rename":
            conv.info = conv.info.model_copy(update={"title": req.title or ""})
            return ConversationsReply(conversation=conv.info)
        if req.action == "delete":
            del self.convs[conv.info.id]
            return ConversationsReply(conversation=conv.info)
        return ConversationsReply(
            export={
                "conversation": conv.info.model_dump(),
                "messages": [m.model_dump(exclude_none=True) for m in conv.messages],
                "log": [e.model_dump() for e in conv.events],
            }
        )

    # -- recall ---------------------------------------------------------------------------
    async def _blocks(self, req: BlocksRequest) -> BlocksReply:
        """An empty archive (``GET /api/conversations/<id>/export?with_archive=1``)."""
        return BlocksReply()

    # -- engine supervisor (the shared fake, tests/fakes/fake_supervisor.py) -------------
    def _info(self, _: Any = None) -> EngineInfo:
        info = self.supervisor.info()
        info.preset_id = self.active_preset
        if self.engine_failure:
            info = info.model_copy(update={"state": "failed", **self.engine_failure})
        return info

    def _presets(self, req: PresetsRequest) -> PresetsReply:
        try:
            return self._preset_action(req)
        except LokiError as exc:
            return PresetsReply(error=exc.info())

    def _preset_action(self, req: PresetsRequest) -> PresetsReply:
        active = self.active_preset
        pid = req.preset_id or ""
        if req.action == "list":
            shown = [public(self.presets[k]) for k in sorted(self.presets)]
            return PresetsReply(presets=shown, active=active)
        if req.action == "save":
            data = dict(req.preset or {})
            try:
                preset = Preset.model_validate(data)
            except ValueError as exc:
                raise InvalidRequest(f"bad preset: {exc}") from exc
            preset.id = preset.id or uuid.uuid4().hex[:12]
            preset.name = preset.name or preset.id
            validate(preset)
            old = self.presets.get(preset.id)
            if not preset.api_key and old is not None:
                preset.api_key = old.api_key  # an empty key keeps the stored one
            preset.api_key_set = bool(preset.api_key)
            self.presets[preset.id] = preset
            return PresetsReply(preset=public(preset), active=active, detail={"notes": []})
        if req.action == "test":
            return PresetsReply(active=active, detail=dict(self.test_reply))
        if req.action == "models":  # the supervisor's own listing, of ``model_dirs``
            return PresetsReply(active=active, detail=list_model_files(self.model_dirs))
        if req.action == "cacheram":
            cache_ram = {"value_mib": 1024, "effective_mib": 1024, "reason": "fake: auto"}
            detail = {"cache_ram": cache_ram, "side_slot": False, "notes": []}
            detail["side_slot_refusal"] = "fake engine: one slot"
            return PresetsReply(active=active, detail=detail)
        if pid not in self.presets:
            raise NotFound(f"no preset {pid!r}")
        if req.action == "get":
            return PresetsReply(preset=public(self.presets[pid]), active=active)
        if req.action == "delete":
            if pid == active:
                raise InvalidRequest("the active preset cannot be deleted: switch first")
            del self.presets[pid]
            return PresetsReply(active=active)
        if req.action == "switch":
            if self.switch_refusal:
                raise InvalidRequest(self.switch_refusal)
            self.switches.append(pid)
            self.active_preset = pid
            self.engine_failure = None
            return PresetsReply(preset=public(self.presets[pid]), active=pid, detail={})
        raise InvalidRequest(f"unknown action {req.action}")

    def held(self) -> int:
        """Leases granted and not released."""
        return self.supervisor.held()
