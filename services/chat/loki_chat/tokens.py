"""Exact token counts with the engine's own tokenizer (issue 23: "count tokens, don't guess").

For a local llama-server, the text of each message is counted by the engine itself
(``POST /tokenize``, llama.cpp server API: ``{"content", "add_special": false}`` →
``{"tokens": [...]}``), and once per model the chat template's overhead of each role is
learnt from ``POST /apply-template`` (``{"messages"}`` → ``{"prompt"}``, the prompt the
engine would evaluate) by difference between renders of small conversations:

- ``user``/``assistant``: the turn markers of each role (their sum is exact; each is half);
- ``system``: the system message's markers plus what a prompt holds besides its messages
  (BOS, the generation prompt) — Loki's prompts always open with one, and a render without
  it would count the template's default system prompt instead; ``tool`` results count as
  ``user``; ``base`` (kept for other templates' needs) is 0.

A message then counts ``overhead[role] + tokens(text)`` (+ ``tokens(name + arguments)`` per
tool call); a whole prompt adds ``base``. Counts are cached by content hash (SHA-256, per
model, at most :data:`MAX_ENTRIES`), asked for in one concurrent batch (at most
:data:`CONCURRENCY` requests at a time), and bounded in time (``timeout_s``, a few hundred
ms): when the engine does not answer in time, or is an external API, or is unknown, the
estimate (:func:`loki_chat.meter.estimate_tokens`) is used and the fallback is logged once
per cause. Counting never raises.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from loki_shared.messages.chat import ChatMessage

from .meter import estimate_tokens, kept_cost

log = logging.getLogger("loki.chat.tokens")

#: Counts remembered (texts, all models together); the oldest forgotten first.
MAX_ENTRIES = 16384
#: ``/tokenize`` requests in flight at once for one batch.
CONCURRENCY = 4
#: Seconds between two look-ups of the engine while none is known.
LOCATE_EVERY_S = 30.0
#: Probe texts for the template overhead (short, one token each on common vocabularies).
_PROBE = ("a", "b", "c", "s")


@dataclass(frozen=True)
class Engine:
    """The local llama-server that counts: its root URL (without ``/v1``), its key and
    model (counts are cached per model)."""

    base_url: str
    api_key: str | None
    model: str


#: ``await locate()``: the engine in use (None when unknown or external).
Locate = Callable[[], Awaitable[Engine | None]]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _texts(message: ChatMessage | dict[str, Any]) -> tuple[str, list[str]]:
    """The text of a message (text parts joined) and its tool calls as ``name + arguments``."""
    if isinstance(message, ChatMessage):
        message = message.model_dump(exclude_none=True, exclude={"loki", "reasoning_model"})
    content = message.get("content")
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
        text = "\n".join(str(p.get("text", "")) for p in parts)
    else:
        text = content or ""
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        calls.append(f"{fn.get('name', '')}{fn.get('arguments', '')}")
    return str(text), calls


class TokenCounts:
    """Token counts by the engine's tokenizer, with the estimate as fallback.

    Args:
        http: the HTTP client for the engine.
        timeout_s: bound of one batch of counts (``LOKI_TOKENIZE_TIMEOUT_S``).
        locate: finds the engine before any lease was seen (``loki.engine.info``).
    """

    def __init__(
        self, http: httpx.AsyncClient, timeout_s: float = 0.3, locate: Locate | None = None
    ) -> None:
        self.http = http
        self.timeout_s = timeout_s
        self.locate = locate
        self.engine: Engine | None = None
        self._known = False  # whether ``engine`` was set (a lease or a look-up)
        self._locate_after = 0.0  # monotonic time before which no look-up is tried
        self._counts: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._overhead: dict[str, dict[str, int]] = {}
        self._logged: set[str] = set()
        self._unsupported: set[str] = set()  # engines answering 404/501 to /tokenize
        #: batches that fell back to the estimate, and batches counted (figures, tests)
        self.fallbacks = 0
        self.batches = 0

    # -- which engine -----------------------------------------------------------------------
    def use(self, base_url: str, api_key: str | None, model: str, external: bool) -> None:
        """The engine of the last lease: an external API (or no URL) counts by estimate."""
        self._known = True
        self.engine = None if external or not base_url else Engine(base_url, api_key, model)

    async def _engine(self) -> Engine | None:
        """The engine of the last lease; before any, asked of ``locate`` (bounded by
        ``timeout_s``, at most every :data:`LOCATE_EVERY_S`)."""
        now = time.monotonic()
        if not self._known and self.locate is not None and now >= self._locate_after:
            self._locate_after = now + LOCATE_EVERY_S
            try:
                self.engine = await asyncio.wait_for(self.locate(), self.timeout_s)
            except Exception:  # noqa: BLE001 - unknown: estimates
                self.engine = None
            self._known = self.engine is not None
        return self.engine

    # -- counting ---------------------------------------------------------------------------
    def text_tokens(self, text: str) -> int | None:
        """The engine's count of ``text`` when known (primed), else None."""
        engine = self.engine
        if engine is None:
            return None
        key = (engine.model, _digest(text))
        n = self._counts.get(key)
        if n is not None:
            self._counts.move_to_end(key)
        return n

    def message_tokens(self, message: ChatMessage | dict[str, Any]) -> int:
        """Tokens of one message as the engine evaluates it: the role's template overhead,
        its text, its tool calls — when every part was counted; else the estimate."""
        engine = self.engine
        over = self._overhead.get(engine.model) if engine else None
        if over is None:
            return estimate_tokens(message)
        text, calls = _texts(message)
        role = message.role if isinstance(message, ChatMessage) else str(message.get("role"))
        total = over.get(role, over["user"]) + kept_cost(message)
        for part in (text, *calls):
            if not part:
                continue
            n = self.text_tokens(part)
            if n is None:
                return estimate_tokens(message)
            total += n
        return total

    def prompt_base(self) -> int:
        """Tokens a prompt holds besides its messages (BOS, generation prompt); 0 unknown."""
        engine = self.engine
        over = self._overhead.get(engine.model) if engine else None
        return over["base"] if over else 0

    def reply_gap(self) -> int:
        """What a measure (``prompt_tokens + completion_tokens``) leaves out of the next
        prompt once messages follow the reply: the reply's end-of-turn marker and the new
        generation prompt — together an assistant message's overhead (0 when unknown)."""
        engine = self.engine
        over = self._overhead.get(engine.model) if engine else None
        return over["assistant"] if over else 0

    def exact(self) -> bool:
        """Whether counts come from the engine now (its template overhead is known)."""
        return bool(self.engine and self.engine.model in self._overhead)

    async def prime(self, messages: Iterable[ChatMessage | dict[str, Any]]) -> bool:
        """Count, in one batch bounded by ``timeout_s``, the texts of ``messages`` not yet
        known (and learn the template's overhead once per model). False (logged once per
        cause) when the estimate stays in use."""
        engine = await self._engine()
        if engine is None or engine.base_url in self._unsupported:
            return False
        wanted: list[str] = []
        seen: set[str] = set()
        for message in messages:
            text, calls = _texts(message)
            for part in (text, *calls):
                if part and part not in seen and self.text_tokens(part) is None:
                    seen.add(part)
                    wanted.append(part)
        if not wanted and engine.model in self._overhead:
            return True
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(self._fill(engine, wanted), self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - timeout, HTTP or decoding: estimates
            self.fallbacks += 1
            cause = "timeout" if isinstance(exc, asyncio.TimeoutError) else type(exc).__name__
            if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in (404, 501):
                self._unsupported.add(engine.base_url)  # not a llama-server: never asked again
                cause = f"HTTP {exc.response.status_code}"
            if cause not in self._logged:
                self._logged.add(cause)
                log.warning(
                    "[tokens] the engine did not count %d texts within %.0f ms (%s): "
                    "estimates used",
                    len(wanted),
                    self.timeout_s * 1000,
                    cause,
                )
            return False
        self.batches += 1
        ms = (time.monotonic() - t0) * 1e3
        log.debug("[tokens] %d texts counted in %.0f ms", len(wanted), ms)
        return True

    async def text_prompt_tokens(self, payload: dict[str, Any]) -> int | None:
        """The exact tokens of the prompt the engine builds for request ``payload`` (its
        ``messages``, ``tools``, ``tool_choice``, ``chat_template_kwargs``: llama-server's
        ``/apply-template`` then ``/tokenize``, BOS as the engine adds it), bounded by
        ``timeout_s``; None for an external or unknown engine, or when it fails in time
        (KEEP_TURN_IMAGES measures an image's cost against it: :mod:`loki_chat.kept_images`).
        """
        engine = await self._engine()
        if engine is None or engine.base_url in self._unsupported:
            return None
        keys = ("messages", "tools", "tool_choice", "chat_template_kwargs")
        body = {k: payload[k] for k in keys if k in payload}
        try:
            return await asyncio.wait_for(self._render(engine, body), self.timeout_s)
        except Exception:  # noqa: BLE001 - timeout, HTTP or decoding: not measured
            log.info(
                "[tokens] the engine did not count a prompt within %.0f ms", self.timeout_s * 1e3
            )
            return None

    async def _fill(self, engine: Engine, texts: list[str]) -> None:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(text: str) -> None:
            async with gate:
                n = await self._tokenize(engine, text)
            self._remember(engine.model, text, n)

        if engine.model not in self._overhead:
            await self._learn_overhead(engine)
        await asyncio.gather(*(one(t) for t in texts))

    def _remember(self, model: str, text: str, n: int) -> None:
        self._counts[(model, _digest(text))] = n
        while len(self._counts) > MAX_ENTRIES:
            self._counts.popitem(last=False)

    def _headers(self, engine: Engine) -> dict[str, str]:
        return {"Authorization": f"Bearer {engine.api_key}"} if engine.api_key else {}

    async def _tokenize(self, engine: Engine, text: str) -> int:
        """``POST /tokenize`` (special tokens parsed, none added): the number of tokens."""
        r = await self.http.post(
            engine.base_url.rstrip("/") + "/tokenize",
            json={"content": text, "add_special": False},
            headers=self._headers(engine),
        )
        r.raise_for_status()
        return len(r.json()["tokens"])

    async def _render(self, engine: Engine, messages: list[dict[str, str]] | dict[str, Any]) -> int:
        """Tokens of the prompt the engine builds for ``messages`` (or a whole request body:
        ``/apply-template``, with its generation prompt; BOS counted as the engine adds it)."""
        body = messages if isinstance(messages, dict) else {"messages": messages}
        r = await self.http.post(
            engine.base_url.rstrip("/") + "/apply-template",
            json=body,
            headers=self._headers(engine),
        )
        r.raise_for_status()
        prompt = r.json()["prompt"]
        r = await self.http.post(
            engine.base_url.rstrip("/") + "/tokenize",
            json={"content": prompt, "add_special": True},
            headers=self._headers(engine),
        )
        r.raise_for_status()
        return len(r.json()["tokens"])

    async def _learn_overhead(self, engine: Engine) -> None:
        """The template's overhead per role, by difference between renders (module doc)."""
        a, b, c, s = _PROBE
        u = {"role": "user", "content": a}
        one, three, with_system, sizes = await asyncio.gather(
            self._render(engine, [u]),
            self._render(
                engine,
                [u, {"role": "assistant", "content": b}, {"role": "user", "content": c}],
            ),
            self._render(engine, [{"role": "system", "content": s}, u]),
            asyncio.gather(*(self._tokenize(engine, t) for t in _PROBE)),
        )
        na, nb, nc, ns = sizes
        pair = max(0, three - one - nb - nc)  # assistant markers + user markers
        user = pair - pair // 2
        # Loki's prompts always open with a system message: the prompt's own tokens (BOS,
        # generation prompt) go with it — and a template's default system prompt, which a
        # render without one would add, is never counted
        over = {
            "user": user,
            "assistant": pair // 2,
            "tool": user,
            "system": max(0, with_system - ns - na - user),
            "base": 0,
        }
        self._overhead[engine.model] = over
        log.info("[tokens] template overhead for %s: %s", engine.model, over)
