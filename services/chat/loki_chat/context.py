"""The seam where a context policy (compaction) plugs into the turn loop.

The loop (:mod:`loki_chat.turn`) calls :meth:`ContextPolicy.maybe_compact` at turn start,
between steps (after tool results), at turn end, on a manual ``compact`` control and
reactively on a recognised context overflow; and :meth:`ContextPolicy.note_step` after every
accepted completion step. The chat service's default policy is
:class:`loki_chat.compaction.CompactionPolicy`; :class:`NoCompaction` never changes anything.
A policy gets its dependencies (NATS, HTTP client, settings) when it is built; a
:class:`ContextView` carries only the facts of one call.

Counting the context (``ctx_used``) is :mod:`loki_chat.meter`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from loki_shared.messages.engine import Lease

from .conversation import Conversation

Trigger = Literal["start", "mid", "end", "manual", "reactive"]


@dataclass
class OverflowInfo:
    """A refusal recognised as a context overflow: the HTTP status, the engine's text, and
    the prompt size it reported when it did (``n_prompt_tokens``) and its window."""

    status: int | None
    body: str
    n_prompt_tokens: int | None = None
    n_ctx: int | None = None


@dataclass
class ContextView:
    """What a :class:`ContextPolicy` gets on each call.

    Attributes:
        conversation: the conversation (its ``messages`` may be rewritten in place; call
            ``conversation.meter.invalidate()`` after doing so).
        trigger: why the policy is called.
        n_ctx: the window in tokens (0 when unknown).
        ctx_used: :meth:`~loki_chat.meter.ContextMeter.used` right now (tokens).
        overflow: set when ``trigger == "reactive"``.
        emit: ``await emit(delta, loki)`` adds a display event (e.g. a compaction marker).
    """

    conversation: Conversation
    trigger: Trigger
    n_ctx: int
    ctx_used: int
    overflow: OverflowInfo | None = None
    emit: Callable[[dict[str, Any], dict[str, Any] | None], Awaitable[Any]] | None = None


class ContextPolicy(Protocol):
    """The compaction seam (see the module docstring)."""

    async def maybe_compact(self, view: ContextView) -> bool:
        """Compact ``view.conversation`` when the policy decides to; return True when the
        model view changed (the loop then persists it and, reactively, replays the step)."""
        ...

    def note_step(
        self,
        cid: str,
        lease: Lease,
        body: bytes,
        usage: dict[str, Any] | None,
        count: int,
        generated_chars: int = 0,
    ) -> None:
        """An accepted completion step of conversation ``cid`` (not stopped, no error) left
        for the engine under ``lease`` with the request ``body`` (the exact bytes sent),
        carrying ``count`` model-view messages; ``usage`` is the final chunk's (decoded, None
        when absent) and ``generated_chars`` the length of the text it generated. A policy
        that subclasses :class:`ContextPolicy` and needs none of it inherits this no-op."""
        return None


class NoCompaction(ContextPolicy):
    """The policy that never compacts (and ignores the steps it is told about)."""

    async def maybe_compact(self, view: ContextView) -> bool:
        return False
