"""Counting the context of a conversation (``ctx_used``, tokens).

``ctx_used`` is the last completion's ``usage.prompt_tokens`` plus the tokens it generated
that will be sent back; reasoning that is not sent back is not counted (only
``reasoning_content`` pieces separated by the server are subtracted, each at most one token
— an under-estimate of reasoning, so an over-estimate of the context: the safe direction).
Messages added since that measure (the new user message, queued ones, tool results the
engine has not seen yet) are added as counts: the engine's own (:mod:`loki_chat.tokens`,
when the meter has a ``counter`` and it was primed), else estimates (characters / 4 + 4 per
message).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from loki_shared.canonical import canonical_json
from loki_shared.messages.chat import ChatMessage

#: Estimate of one image part (tokens): the engine's real cost is only known from its usage.
IMAGE_ESTIMATE = 256


def estimate_tokens(message: ChatMessage | dict[str, Any] | str) -> int:
    """Rough token estimate of one message: characters of its JSON / 4, plus 4; an image
    part counts its measured cost when KEEP_TURN_IMAGES kept it (``loki_cost``), else
    :data:`IMAGE_ESTIMATE` (its data URL's characters are not tokens)."""
    if isinstance(message, str):
        return len(message) // 4 + 4
    if isinstance(message, ChatMessage):
        message = message.model_dump(exclude_none=True, exclude={"loki", "reasoning_model"})
    content = message.get("content")
    images = 0
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict) and p.get("type") == "image_url"]
        if parts:
            images = sum(int(p.get("loki_cost") or IMAGE_ESTIMATE) for p in parts)
            kept = [
                p for p in content if not (isinstance(p, dict) and p.get("type") == "image_url")
            ]
            message = {**message, "content": kept}
    return len(canonical_json(message).decode("utf-8")) // 4 + 4 + images


def kept_cost(message: ChatMessage | dict[str, Any]) -> int:
    """The measured tokens of the images KEEP_TURN_IMAGES keeps in ``message`` (their
    ``loki_cost``; 0 without any): what an exact text count adds for them."""
    content = message.content if isinstance(message, ChatMessage) else message.get("content")
    if not isinstance(content, list):
        return 0
    return sum(
        int(p.get("loki_cost") or 0)
        for p in content
        if isinstance(p, dict) and p.get("type") == "image_url"
    )


class Counter(Protocol):
    """What the meter asks of a token counter (:class:`loki_chat.tokens.TokenCounts`)."""

    def message_tokens(self, message: ChatMessage | dict[str, Any]) -> int: ...
    def use(self, base_url: str, api_key: str | None, model: str, external: bool) -> None: ...
    def prompt_base(self) -> int: ...
    def reply_gap(self) -> int: ...
    async def prime(self, messages: Any) -> bool: ...


@dataclass
class ContextMeter:
    """``measured``: tokens of the model view as of the last completion (None: never
    measured, or invalidated by a rewrite of the history); ``measured_count``: how many
    messages of the model view that measure covers. ``counter`` (not persisted): the
    engine's token counts, set by the chat service; None counts by estimate."""

    measured: int | None = None
    measured_count: int = 0
    n_ctx: int | None = None  # the window of the last lease (tokens)
    counter: Counter | None = field(default=None, repr=False, compare=False)

    def tokens(self, message: ChatMessage | dict[str, Any] | str) -> int:
        """Tokens of one message (a str: a user message): the counter's, else the
        estimate."""
        if self.counter is None:
            return estimate_tokens(message)
        if isinstance(message, str):
            message = {"role": "user", "content": message}
        return self.counter.message_tokens(message)

    async def prime(self, system_prompt: str, messages: list[ChatMessage]) -> None:
        """Have the counter count what :meth:`used` will need (bounded in time; estimates
        otherwise)."""
        if self.counter is not None:
            await self.counter.prime([{"role": "system", "content": system_prompt}, *messages])

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
            return self.view_tokens(system_prompt, messages)
        since = messages[self.measured_count :]
        gap = self.counter.reply_gap() if self.counter is not None and since else 0
        return self.measured + gap + sum(self.tokens(m) for m in since)

    def view_tokens(self, system_prompt: str, messages: list[ChatMessage]) -> int:
        """The count of the whole prompt ``[system, *messages]`` (no measure used)."""
        base = self.counter.prompt_base() if self.counter is not None else 0
        return (
            base
            + self.tokens({"role": "system", "content": system_prompt})
            + sum(self.tokens(m) for m in messages)
        )

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
