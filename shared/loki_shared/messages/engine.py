"""Messages of the engine supervisor (``loki.engine.*``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .base import Msg, Reply, RequestKind

EngineStateName = Literal["starting", "ready", "failed", "stopped"]


class EngineInfoRequest(Msg):
    """``loki.engine.info``."""


class EngineInfo(Reply):
    """What the supervisor knows of the engine.

    ``base_url`` is the OpenAI-compatible root without ``/v1`` (``http://127.0.0.1:8091``).
    ``n_ctx`` is the window of one conversation (tokens); ``slot_n_ctx`` the per-slot
    ``n_ctx`` read from ``/props``. ``api_key`` is the engine's own key (internal use only).
    """

    state: EngineStateName = "stopped"
    base_url: str = ""
    model: str = ""
    model_path: str | None = None
    n_ctx: int = 0
    total_slots: int = 0
    slot_n_ctx: list[int] = Field(default_factory=list)
    build_info: str | None = None
    build_number: int | None = None
    chat_template: str | None = None
    external: bool = False
    api_key: str | None = None
    detail: str = ""


class EngineState(Msg):
    """``loki.engine.state`` event: a change of the engine's state.

    ``stderr_tail`` holds the last lines llama-server wrote when it failed.
    """

    state: EngineStateName
    ts: float
    detail: str = ""
    stderr_tail: list[str] = Field(default_factory=list)


class LeaseRequest(Msg):
    """``loki.engine.lease``: ask to send one request of ``kind`` to the engine.
    ``wait_s`` bounds how long the supervisor queues the request (FIFO per slot)."""

    kind: RequestKind
    conversation: str | None = None
    wait_s: float = 60.0


class Lease(Reply):
    """A granted lease: where to send the request and with which ``id_slot`` (None: let the
    engine choose). ``ttl_s``: the lease expires if not released or renewed by then."""

    lease_id: str = ""
    base_url: str = ""
    id_slot: int | None = None
    n_ctx: int = 0
    model: str = ""
    external: bool = False
    api_key: str | None = None
    ttl_s: float = 0.0


class ReleaseRequest(Msg):
    """``loki.engine.release``."""

    lease_id: str


class ReleaseReply(Reply):
    ok: bool = False


class PresetsRequest(Msg):
    """``loki.engine.presets``: list, get, save, delete, switch, test a preset."""

    action: Literal["list", "get", "save", "delete", "switch", "test", "cacheram"]
    preset_id: str | None = None
    preset: dict[str, Any] | None = None


class PresetsReply(Reply):
    presets: list[dict[str, Any]] = Field(default_factory=list)
    preset: dict[str, Any] | None = None
    active: str | None = None
    detail: dict[str, Any] | None = None
