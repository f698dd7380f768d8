"""Messages about the user's memory key (``loki.memory.*``).

The key travels only over NATS (base64 in ``key_b64``); no service writes it to disk or logs.
"""

from __future__ import annotations

from typing import Literal

from .base import Msg, Reply

MemoryState = Literal["off", "locked", "unlocked"]


class MemoryKeyEvent(Msg):
    """``loki.memory.key`` (broadcast by the gateway): the memory's new ``state``; with
    ``key_b64`` (32 bytes, base64) when ``unlocked``, None otherwise (forget the key).
    ``key_id`` names the key (:func:`loki_shared.memkey.key_id`)."""

    state: MemoryState = "locked"
    key_b64: str | None = None
    key_id: str | None = None


class MemoryStatusRequest(Msg):
    """``loki.memory.status``: a service that starts asks the gateway for the state and key."""


class MemoryStatusReply(Reply):
    """The gateway's answer: ``state``, and the key when ``unlocked``."""

    state: MemoryState = "off"
    key_b64: str | None = None
    key_id: str | None = None
