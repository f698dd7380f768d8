"""Counting the context of a conversation (``ctx_used``, tokens).

``ctx_used`` is the last completion's ``usage.prompt_tokens`` plus the tokens it generated
that will be sent back; reasoning that is not sent back is not counted (only
``reasoning_content`` pieces separated by the server are subtracted, each at most one token
— an under-estimate of reasoning, so an over-estimate of the context: the safe direction).
Messages added since that measure (the new user message, queued ones, tool results the
engine has not seen yet) are added as estimates (characters / 4 + 4 per message).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loki_shared.canonical import canonical_json
from loki_shared.messages.chat import ChatMessage


def estimate_tokens(message: ChatMessage | dict[str, Any] | str) -> int:
    """Rough token estimate of one message: characters of its JSON / 4, plus 4."""
    if isinstance(message, str):
        return len(message) // 4 + 4
    if isinstance(message, ChatMessage):
        message = message.model_dump(exclude_none=True, exclude={"loki", "reasoning_model"})
    return len(canonical_json(message).decode("utf-8")) // 4 + 4


@dataclass
class ContextMeter:
    """``measured``: tokens of the model view as of the last completion (None: never
    measured, or invalidated by a rewrite of the history); ``measured_count``: how many
    messages of the model view that measure covers."""

    measured: int | None = None
    measured_count: int = 0
    n_ctx: int | None = None  # the window of the last lease (tokens)

    def record(
        self,
        usage: dict[str, Any] | None,
        reasoning_pieces: int,
        reasoning_sent_back: bool,
        count: int,
    ) -> None:
        """Take the measure of a completion whose reply is now message ``count - 1``.
        Without ``usage.prompt_tokens`` the measure is dropped (estimates take over)."""
        prompt = (usage or {}).get("prompt_tokens")
        if not isinstance(prompt, int):
            self.measured = None
            self.measured_count = 0
            return
        completion = (usage or {}).get("completion_tokens")
        generated = completion if isinstance(completion, int) else 0
        if not reasoning_sent_back:
            generated = max(0, generated - reasoning_pieces)
        self.measured = prompt + generated
        self.measured_count = count

    def invalidate(self) -> None:
        """The history was rewritten (compaction, reset): estimates only until the next
        completion."""
        self.measured = None
        self.measured_count = 0

    def used(self, system_prompt: str, messages: list[ChatMessage]) -> int:
        """``ctx_used`` in tokens (see the module docstring)."""
        if self.measured is None or self.measured_count > len(messages):
            return estimate_tokens({"role": "system", "content": system_prompt}) + sum(
                estimate_tokens(m) for m in messages
            )
        return self.measured + sum(estimate_tokens(m) for m in messages[self.measured_count :])

    def to_dict(self) -> dict[str, Any]:
        return {
            "measured": self.measured,
            "measured_count": self.measured_count,
            "n_ctx": self.n_ctx,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ContextMeter:
        data = data or {}
        return cls(
            measured=data.get("measured"),
            measured_count=data.get("measured_count", 0),
            n_ctx=data.get("n_ctx"),
        )
