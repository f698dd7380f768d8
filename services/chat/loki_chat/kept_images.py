"""KEEP_TURN_IMAGES (seeds; ``LOKI_KEEP_TURN_IMAGES``, grey zone, off by default): images kept
in the history past their turn, by reference, within a measured budget.

Off, nothing here runs: the ephemeral rule (:mod:`loki_chat.images`) alone, requests
byte-identical to before the key (frozen copy in tests/chat/test_chat_images.py).

Rules (tests named in docs/behaviour.md (attachments and images)):

- A reference: with the key on, an image part of the model view is stored as
  ``{"type": "image_url", "image_url": {"url": ""}, "loki_name", "loki_ref": <attachment id>,
  "loki_sha256": <SHA-256 hex of its data URL>}`` (:func:`ref_part`); the image itself lives
  on the conversation's shelf (:class:`loki_chat.image_shelf.ImageShelf`), never in the
  stored conversation. ``loki_cost`` (tokens, measured) is added after its first request,
  ``loki_kept: true`` when it is kept past its turn. Loki's ``loki_*`` marks never reach the
  engine (:func:`loki_chat.images.wire_parts`).
- Before every request (:meth:`KeptImages.wire_view`) each reference becomes the
  ``image_url`` part the ephemeral rule would send (same bytes): an image of the running turn
  from the turn's own copy; a kept image re-read from the shelf and sent only when its data
  URL hashes to the SHA-256 recorded and the step's lease says the endpoint sees images
  (``Lease.vision``). A changed or missing image, or a lease without vision, makes it
  ephemeral at once: its part becomes the ephemeral marker (:func:`drop_parts`).
- Its cost is measured by the engine (:meth:`KeptImages.measure`): after the first request
  that sends it, ``usage.prompt_tokens`` minus the exact count of the same request without
  its image parts (the engine's template and tokenizer, :meth:`loki_chat.tokens.TokenCounts.
  text_prompt_tokens`, as for context accounting) minus the costs already known of the other
  images it carried. Several images first sent in one request share that difference equally
  (the engine reports one ``prompt_tokens``). No usage, an external API, a count that fails
  or a difference below one token per image: unmeasurable, so ephemeral.
- At the turn's end (:func:`settle_turn`) the turn's images are kept in their order while
  the kept total stays within :data:`KEEP_SHARE` of the window (``n_ctx`` of the slot); the
  first that would exceed it and the rest of that turn's images become markers, as does
  any image whose cost is unknown.
- Compaction, its last-resort shrink and the start/mid/end threshold drop kept images first
  (:func:`drop_kept`, called by :class:`loki_chat.compaction.CompactionPolicy`) before any
  text is summarised.
- A marker is the ephemeral rule's text, and a message whose image parts are all gone
  becomes exactly the text the ephemeral rule writes (:func:`loki_chat.images.forget_images`),
  so the prefix of later requests is the same whichever way an image left.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from loki_shared.messages.chat import ChatMessage, ImageAttachment

from .images import marker

#: Share of the window (``n_ctx``) the kept images may take together.
KEEP_SHARE = 0.10

Part = dict[str, Any]


def digest(url: str) -> str:
    """SHA-256 hex of an image's data URL (its type and bytes)."""
    return hashlib.sha256(url.encode("utf-8")).hexdigest()


def ref_part(image: ImageAttachment) -> Part:
    """The stored reference of ``image`` (no data; see the module rules)."""
    return {
        "type": "image_url",
        "image_url": {"url": ""},
        "loki_name": image.name,
        "loki_ref": image.id,
        "loki_sha256": digest(image.url),
    }


def ref_content(text: str, images: list[ImageAttachment]) -> str | list[Part]:
    """A user message's content with references: like
    :func:`loki_chat.images.user_content`, one reference per image."""
    if not images:
        return text
    parts: list[Part] = [{"type": "text", "text": text}] if text else []
    return parts + [ref_part(i) for i in images]


def is_image(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"


def image_parts(message: ChatMessage) -> list[Part]:
    """The image parts of ``message`` (references or data URLs), in order."""
    content = message.content
    return [p for p in content if is_image(p)] if isinstance(content, list) else []


def drop_parts(message: ChatMessage, drop: Callable[[Part], bool]) -> list[Part]:
    """Replace the image parts of ``message`` for which ``drop(part)`` by marker text parts;
    when no image part is left, the content becomes the ephemeral rule's text (parts joined
    by blank lines). Returns the parts dropped."""
    content = message.content
    if not isinstance(content, list):
        return []
    dropped: list[Part] = []
    parts: list[Part] = []
    for part in content:
        if is_image(part) and drop(part):
            dropped.append(part)
            parts.append({"type": "text", "text": marker(str(part.get("loki_name") or "image"))})
        else:
            parts.append(part)
    if not dropped:
        return []
    if any(is_image(p) for p in parts):
        message.content = parts
    else:
        texts = [str(p.get("text") or "") for p in parts if p.get("type") == "text"]
        message.content = "\n\n".join(t for t in texts if t)
    return dropped


def kept_total(messages: list[ChatMessage]) -> int:
    """Tokens of the kept images of ``messages`` (their measured costs)."""
    return sum(
        int(p.get("loki_cost") or 0) for m in messages for p in image_parts(m) if p.get("loki_kept")
    )


def drop_kept(messages: list[ChatMessage]) -> int:
    """Make every kept image ephemeral (its marker); returns the tokens they cost (0: none
    was kept). The caller invalidates the meter's measure."""
    freed = 0
    for message in messages:
        for part in drop_parts(message, lambda p: bool(p.get("loki_kept"))):
            freed += int(part.get("loki_cost") or 0)
    return freed


def settle_turn(messages: list[ChatMessage], fresh: set[str], n_ctx: int) -> list[str]:
    """The turn's end: keep the turn's images (ids in ``fresh``, in order) within the budget
    (module rules); every other image not kept becomes its marker. Returns the ids kept."""
    budget = KEEP_SHARE * n_ctx
    total = kept_total(messages)
    over = n_ctx <= 0
    kept: list[str] = []
    for message in messages:
        for part in image_parts(message):
            if part.get("loki_kept") or part.get("loki_ref") not in fresh:
                continue
            cost = part.get("loki_cost")
            if over or not isinstance(cost, int) or cost <= 0:
                continue
            if total + cost > budget:
                over = True  # this one and the rest of the turn stay ephemeral
                continue
            total += cost
            part["loki_kept"] = True
            kept.append(str(part["loki_ref"]))
    for message in messages:
        drop_parts(message, lambda p: not p.get("loki_kept"))
    return kept


def text_only(payload: dict[str, Any]) -> dict[str, Any]:
    """The request ``payload`` without its image parts (what its text alone costs)."""
    messages = []
    for item in payload.get("messages") or []:
        content = item.get("content")
        if isinstance(content, list):
            parts = [p for p in content if not is_image(p)]
            item = {**item, "content": parts if parts else ""}
        messages.append(item)
    return {**payload, "messages": messages}


def share_cost(prompt_tokens: int, text_tokens: int, known: int, n: int) -> int | None:
    """Each of ``n`` new images' cost: ``prompt_tokens - text_tokens - known`` shared
    equally; None when that is below one token an image (unmeasurable)."""
    total = prompt_tokens - text_tokens - known
    if n <= 0 or total < n:
        return None
    return total // n


#: ``await count(payload)``: the exact tokens of a request's prompt (None: not counted).
Count = Callable[[dict[str, Any]], Awaitable[int | None]]
#: ``await shelf()``: the conversation's images on its shelf, by attachment id.
Shelf = Callable[[], Awaitable[dict[str, ImageAttachment]]]


@dataclass
class KeptImages:
    """One turn's side of the rule: the turn's own images (``fresh``, by id), the ids whose
    cost was asked already (``tried``), and those first sent by the last request (``new``)."""

    fresh: dict[str, ImageAttachment] = field(default_factory=dict)
    tried: set[str] = field(default_factory=set)
    new: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # names made ephemeral (figures, logs)

    def content(self, text: str, images: list[ImageAttachment]) -> str | list[Part]:
        """A user message arriving in this turn: references, the images remembered."""
        for image in images:
            self.fresh[image.id] = image
        return ref_content(text, images)

    @staticmethod
    def start(messages: list[ChatMessage]) -> None:
        """The turn's start: every image not kept (one a crash left) becomes its marker."""
        for message in messages:
            drop_parts(message, lambda p: not p.get("loki_kept"))

    async def wire_view(
        self, messages: list[ChatMessage], shelf: Shelf, vision: bool
    ) -> tuple[list[ChatMessage], bool]:
        """The model view to send: references resolved (module rules). Kept images that
        cannot be sent are made ephemeral in ``messages`` itself; the flag says whether that
        happened (the caller then persists and invalidates the meter)."""
        stored: dict[str, ImageAttachment] | None = None
        changed = False

        async def sendable(part: Part) -> str | None:
            nonlocal stored
            ref = str(part.get("loki_ref") or "")
            if ref in self.fresh:
                return self.fresh[ref].url
            if not part.get("loki_kept") or not vision:
                return None
            if stored is None:
                stored = await shelf()
            image = stored.get(ref)
            if image is None or digest(image.url) != part.get("loki_sha256"):
                return None
            return image.url

        out: list[ChatMessage] = []
        self.new = []
        for message in messages:
            refs = [p for p in image_parts(message) if p.get("loki_ref")]
            if not refs:
                out.append(message)
                continue
            urls = {id(p): await sendable(p) for p in refs}
            gone = drop_parts(message, _unsent({key for key, url in urls.items() if not url}))
            if gone:
                changed = True
                self.dropped += [str(p.get("loki_name")) for p in gone]
            if not isinstance(message.content, list):
                out.append(message)
                continue
            parts: list[Part] = []
            for part in message.content:
                url = urls.get(id(part))
                if url:
                    parts.append({**part, "image_url": {"url": url}})
                    ref = str(part["loki_ref"])
                    if "loki_cost" not in part and ref not in self.tried and ref not in self.new:
                        self.new.append(ref)
                else:
                    parts.append(part)
            out.append(message.model_copy(update={"content": parts}))
        return out, changed

    async def measure(
        self,
        messages: list[ChatMessage],
        payload: dict[str, Any],
        usage: dict[str, Any] | None,
        count: Count | None,
    ) -> int | None:
        """After a request that sent ``new`` images: their cost (module rules), written as
        ``loki_cost`` on their parts in ``messages``; None when unmeasurable (they stay
        without a cost, so ephemeral). Never raises."""
        new, self.new = self.new, []
        if not new:
            return None
        self.tried.update(new)
        prompt = (usage or {}).get("prompt_tokens")
        if not isinstance(prompt, int) or count is None:
            return None
        text = await count(text_only(payload))
        if text is None:
            return None
        sent = [p for m in payload.get("messages") or [] for p in _parts(m) if is_image(p)]
        known = sum(
            int(p.get("loki_cost") or 0)
            for m in messages
            for p in image_parts(m)
            if p.get("loki_ref") not in new
        )
        n = sum(1 for m in messages for p in image_parts(m) if p.get("loki_ref") in new)
        if len(sent) < n:
            return None
        cost = share_cost(prompt, text, known, n)
        if cost is None:
            return None
        for message in messages:
            for part in image_parts(message):
                if part.get("loki_ref") in new:
                    part["loki_cost"] = cost
        return cost


def _unsent(keys: set[int]) -> Callable[[Part], bool]:
    """Whether a part is one of those (by identity) that cannot be sent."""
    return lambda part: id(part) in keys


def _parts(item: dict[str, Any]) -> list[Any]:
    content = item.get("content")
    return content if isinstance(content, list) else []
