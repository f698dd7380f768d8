"""Slot transfer between pooled engines (issue 44; only with ``LOKI_ENGINE_SLOT_DIR``).

Skeleton: the API the pool codes against; the bodies follow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx

from . import slot_files

#: Seconds a slot stays idle after a ``main`` turn before it is saved (failover insurance).
IDLE_S = 2.0


@dataclass(frozen=True)
class EngineRef:
    """A pooled engine as the transfer sees it: its id, base URL, API key, model name
    (``/props`` ``model_path``) and slot ``n_ctx`` (tokens)."""

    id: str
    base_url: str
    api_key: str | None
    model: str
    n_ctx: int


@dataclass(frozen=True)
class Occupant:
    """The conversation whose ``main`` prompt a slot holds: its id, the cumulative
    fingerprints of that prompt, and whether that state is already on disk."""

    conversation: str
    fingerprints: tuple[str, ...]
    saved: bool


@dataclass(frozen=True)
class GrantFacts:
    """What the pool decided for one grant: where it runs, for what, and what the slot held."""

    engine: EngineRef
    id_slot: int
    kind: str
    conversation: str | None
    fingerprints: tuple[str, ...]
    prefix: int
    occupant: Occupant | None
    moved_from: str | None


@dataclass
class TransferOutcome:
    """What :meth:`SlotTransfer.before_grant` did."""

    saved_occupant: bool = False
    transfer: Literal["restored", "recomputed"] | None = None
    restored_tokens: int | None = None
    file: str | None = None
    error: str | None = None


class SlotTransfer:
    """Saves and restores pooled slots through the shared slot directory."""

    def __init__(
        self,
        slot_dir: Path | None,
        client: httpx.AsyncClient | None = None,
        max_bytes: int = slot_files.DEFAULT_MAX_MB * 1024 * 1024,
    ) -> None:
        self.slot_dir = slot_dir
        self.max_bytes = max_bytes
        self._client = client
        self.enabled = slot_dir is not None

    async def before_grant(self, facts: GrantFacts) -> TransferOutcome:
        return TransferOutcome()

    def after_release(
        self,
        engine: EngineRef,
        id_slot: int,
        conversation: str,
        fingerprints: tuple[str, ...],
        still_idle: Callable[[], bool],
        on_saved: Callable[[str], None],
    ) -> None:
        return None

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
