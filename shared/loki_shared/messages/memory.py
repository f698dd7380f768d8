"""Messages about the user's memory key (``loki.memory.*``)."""

from __future__ import annotations

from typing import Literal

from .base import Msg, Reply

MemoryState = Literal["off", "locked", "unlocked"]


class MemoryKeyEvent(Msg):
    """``loki.memory.key``: the gateway hands the derived memory key to the services
    (``key_b64`` set) or tells them to forget it (``key_b64`` None). Never logged or stored."""

    key_b64: str | None = None
    key_id: str | None = None


class MemoryStatusRequest(Msg):
    """``loki.memory.status``: a service that starts asks the gateway for the key."""


class MemoryStatusReply(Reply):
    state: MemoryState = "off"
    key_b64: str | None = None
    key_id: str | None = None
