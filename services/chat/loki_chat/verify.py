"""The verifier: a side job that checks a turn's final answer against the user's request.

Rules (docs/behaviour.md (chat, the verifier)):

- On when ``LOKI_VERIFY`` is on, or per preset: the active preset's feature ``VERIFY``
  (carried by the lease as ``Lease.verify``) wins over the key when it says on or off.
  Off: nothing is sent, the turn's requests are byte-identical to before (frozen copy).
- After a main turn's final text answer (``finish_reason`` ``stop``; not after a stop, an
  error, a cut reply, a Continue, or a sub-agent's turn), one request of kind ``verify``
  (its own lease, released with ``job_done``): the verifier's system prompt and one user
  message holding the user's last real request and the answer; no tools; not streamed to
  the user; ``max_tokens`` ``LOKI_VERIFY_MAX_TOKENS``.
- Its answer is a one-line JSON verdict ``{"verdict": "pass" | "fail", "reason": "..."}``;
  anything else (no JSON object, another verdict) is a *malformed* verdict, treated as a
  pass and logged; an engine failure likewise (the answer stands).
- A failing verdict adds ONE corrective step (:data:`VERIFY_REMINDER` with the reason,
  injected by the turn loop as ``loki.injected="verify"``), never more than one per turn.
- Its usage never reaches the conversation's meter: the turn's ``ctx_used`` stays the main
  conversation's own. Its perf record has kind ``verify``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loki_shared.fingerprint import fingerprints
from loki_shared.lease import EngineLease, LeaseError, LeaseStopped
from loki_shared.messages.chat import ChatMessage
from loki_shared.messages.perf import PerfRecord

from .compaction.rules import is_real_request, text_of
from .engine import EngineClient
from .request import build_payload, encode, wire_messages
from .settings import Settings

log = logging.getLogger("loki.chat.verify")

VERIFY_PROMPT = (
    "You check an assistant's answer against the user's request. Judge only whether the "
    "answer does what the request asks and contains no evident error. Reply with one line "
    'of JSON and nothing else: {"verdict": "pass", "reason": "<why>"} or '
    '{"verdict": "fail", "reason": "<what is wrong or missing>"}.'
)

VERIFY_REMINDER = (
    "[Loki] A check of your last answer found a problem: {reason} "
    "Answer the user's request again now, correcting it."
)

_OBJECT = re.compile(r"\{.*?\}", re.DOTALL)


@dataclass
class Verdict:
    """A verifier's verdict: ``ok`` (pass), ``reason`` (its words, or why it was taken as
    a pass), ``malformed`` (the answer was no valid verdict: taken as a pass)."""

    ok: bool
    reason: str
    malformed: bool = False


def parse_verdict(text: str) -> Verdict:
    """The verdict in the verifier's answer ``text``: the first JSON object in it whose
    ``verdict`` is ``pass`` or ``fail`` (any case); otherwise a malformed verdict (a pass)."""
    for match in _OBJECT.finditer(text or ""):
        try:
            obj = json.loads(match.group(0))
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        verdict = obj.get("verdict")
        reason = obj.get("reason")
        reason = reason.strip() if isinstance(reason, str) else ""
        if isinstance(verdict, str) and verdict.strip().lower() in ("pass", "fail"):
            return Verdict(ok=verdict.strip().lower() == "pass", reason=reason)
    return Verdict(
        ok=True, reason=f"malformed verdict: {(text or '').strip()[:200]!r}", malformed=True
    )


def last_request(messages: list[ChatMessage]) -> str | None:
    """The text of the last user message the user wrote (not a reminder, not a summary)."""
    for message in reversed(messages):
        if is_real_request(message):
            return text_of(message)
    return None


def verify_message(request: str, answer: str) -> str:
    """The verifier's user message: the request and the answer, delimited."""
    return (
        f"The user's request:\n<request>\n{request}\n</request>\n\n"
        f"The assistant's answer:\n<answer>\n{answer}\n</answer>\n\n"
        "Your verdict, as one line of JSON:"
    )


def corrective_reminder(verdict: Verdict) -> str:
    """The reminder of the corrective step (the verdict's reason in it)."""
    reason = verdict.reason or "the answer does not do what the request asks."
    if not reason.endswith((".", "!", "?")):
        reason += "."
    return VERIFY_REMINDER.format(reason=reason)


def verify_enabled(settings: Settings, preset_verify: bool | None) -> bool:
    """The preset's ``VERIFY`` feature when it says on or off (``Lease.verify``), else
    ``LOKI_VERIFY``."""
    return settings.verify if preset_verify is None else preset_verify


@dataclass
class VerifyOutcome:
    """One verification: ``verdict`` (None when stopped), ``stopped``."""

    verdict: Verdict | None
    stopped: bool = False


async def run_verify(
    *,
    settings: Settings,
    engine: EngineClient,
    lease: Callable[[list[str]], EngineLease],
    conversation: str,
    request: str,
    answer: str,
    stop: asyncio.Event,
    publish_perf: Callable[[PerfRecord], None],
    prompt: str = VERIFY_PROMPT,
    message: str | None = None,
) -> VerifyOutcome:
    """Run one verification of ``answer`` against ``request`` under a ``verify`` lease
    (``lease(fingerprints)``: the fingerprints of the messages it sends), for
    ``conversation`` (its id: perf names what intercalated). Never raises for engine or
    lease trouble: that verdict is a pass (logged). ``prompt`` and ``message`` replace the
    verifier's system prompt and user message (code mode's criteria,
    :mod:`loki_chat.code.check`)."""
    user = message if message is not None else verify_message(request, answer)
    wire = wire_messages(prompt, [ChatMessage(role="user", content=user)])
    try:
        async with lease(fingerprints(wire)) as held:
            payload = build_payload(settings, held.lease, wire, None)
            payload["max_tokens"] = settings.verify_max_tokens
            result = await engine.stream(
                held.lease.base_url,
                encode(payload),
                api_key=held.lease.api_key,
                stop=stop,
                on_delta=_ignore,
            )
            usage = result.acc.usage or {}
            held.report(
                usage.get("prompt_tokens"),
                usage.get("cached_tokens"),
                job_done=True,
                prompt_fingerprint=next(reversed(fingerprints(wire)), None),
            )
            granted = held.lease
    except LeaseStopped:
        return VerifyOutcome(verdict=None, stopped=True)
    except LeaseError as exc:
        log.warning("[verify] %s: no lease (%s); the answer stands", conversation, exc)
        return VerifyOutcome(verdict=Verdict(ok=True, reason=f"no lease: {exc}", malformed=True))
    if result.responded:
        publish_perf(result.perf_record("verify", conversation, granted, wire))
    if result.stopped:
        return VerifyOutcome(verdict=None, stopped=True)
    if result.error is not None:
        log.warning("[verify] %s: %s; the answer stands", conversation, result.error)
        return VerifyOutcome(
            verdict=Verdict(ok=True, reason=f"verifier failed: {result.error}", malformed=True)
        )
    verdict = parse_verdict(result.acc.content)
    if verdict.malformed:
        log.warning("[verify] %s: %s; taken as a pass", conversation, verdict.reason)
    return VerifyOutcome(verdict=verdict)


async def _ignore(_deltas: list[dict[str, Any]]) -> None:
    """The verifier streams nothing to the user."""
