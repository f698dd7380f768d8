"""``loki e2e chat``: chat with a Loki through a relay it does not trust, as a paired device
(issue 45), and the small client class behind it (:class:`E2EClient`, used by the tests).

Every request is sealed under the device key (:mod:`loki_shared.e2e_envelope`) with a
strictly increasing counter; every answer and every event must be an envelope that opens
with the associated data this client expects. Anything else (a plain ``/api/chat`` answer,
an unsealed frame, a frame out of place, a tampered byte) stops the client with
:class:`E2EError` saying so: it never shows or acts on an unsealed answer.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import typer

from loki_shared import e2e_envelope as env

#: A seq id: ASCII digits, at most 16 (str.isdigit would take "²", and int() "١٢").
_SEQ = re.compile(r"[0-9]{1,16}")


class E2EError(Exception):
    """The relay (or something on the way) broke the e2e protocol: unsealed answer
    (downgrade), envelope that does not open (tampered, replayed, moved, reordered)."""


class E2ERefused(Exception):
    """The gateway refused the request (``status``, OpenAI ``error`` object). When the
    refusal came unsealed (``sealed`` False: an unknown/revoked device, a rejected envelope,
    a replay) it is not authenticated: the relay could have forged it."""

    def __init__(self, status: int, error: dict[str, Any], sealed: bool) -> None:
        self.status = status
        self.error = error
        self.sealed = sealed
        where = "sealed" if sealed else "unsealed, not authenticated"
        super().__init__(f"{status} {error.get('code')}: {error.get('message')} ({where})")


@dataclass
class Event:
    """One opened SSE event: ``seq`` (the SSE id; for named events the last seq),
    ``name`` (``message``, ``history``, ``reconnect``) and its ``data`` (the object
    ``/api/chat`` would have sent)."""

    seq: int
    name: str
    data: dict[str, Any]


class E2EClient:
    """A paired device talking to ``base_url`` (the relay's address) with httpx.

    Args:
        code: the pairing code (``loki-e2e1:...``) shown once when the device was created.
        base_url: where to send the requests (the relay); the code's base path is appended.
        timeout: seconds per request (the stream's read timeout too).

    Raises:
        ValueError: a damaged pairing code.
    """

    def __init__(self, code: str, base_url: str, timeout: float = 30.0) -> None:
        self.device, self.key, base = env.read_code(code)
        self.http = httpx.Client(base_url=base_url.rstrip("/") + base, timeout=timeout)
        self._last = 0
        self._lock = threading.Lock()  # the counter
        # one request at a time until its answer's headers: counters reach Loki in order
        self._sending = threading.Lock()

    def close(self) -> None:
        """Close the HTTP connections."""
        self.http.close()

    def _counter(self) -> int:
        # Time-based (microseconds), so a restarted client still counts above its past.
        with self._lock:
            self._last = max(self._last + 1, time.time_ns() // 1000)
            return self._last

    def _sealed_request(self, route: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        counter = self._counter()
        wire = env.seal(
            self.key,
            self.device,
            {"counter": counter, "body": body},
            env.aad(self.device, route, "request"),
        )
        return counter, wire

    def request(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` sealed to ``/api/e2e/<route>`` and return the opened answer body.

        Raises:
            E2ERefused: the gateway refused (sealed error body, or a plain refusal).
            E2EError: the answer is not sealed or does not open for this request.
        """
        with self._sending:
            counter, wire = self._sealed_request(route, body)
            response = self.http.post(f"/api/e2e/{route}", json=wire)
        try:
            obj = response.json()
        except ValueError as exc:
            raise E2EError(f"downgrade: the answer to {route} is not JSON, not sealed") from exc
        if response.status_code >= 400 and isinstance(obj, dict) and "error" in obj:
            raise E2ERefused(response.status_code, obj["error"], sealed=False)
        try:
            payload = env.open_payload(
                self.key, env.parse(obj), env.aad(self.device, route, "response", counter)
            )
        except env.EnvelopeError as exc:
            raise E2EError(f"the answer to {route} is not sealed for this request: {exc}") from exc
        status, inner = payload.get("status"), payload.get("body")
        if status != response.status_code:
            raise E2EError("the HTTP status differs from the sealed one")
        if status >= 400:
            raise E2ERefused(status, inner.get("error", {}), sealed=True)
        return inner

    def send(self, content: str, conversation: str | None = None) -> dict[str, Any]:
        """Start a turn: ``{"conversation", "queued"}``."""
        return self.request("send", {"conversation": conversation, "content": content})

    def control(self, action: str, conversation: str, content: str | None = None) -> dict[str, Any]:
        """``stop``/``reset``/``compact``/``continue``/``cancel_queued``: ``{"ok", "detail"}``."""
        body: dict[str, Any] = {"action": action, "conversation": conversation}
        if content is not None:
            body["content"] = content
        return self.request("control", body)

    def state(self, conversation: str | None = None) -> dict[str, Any]:
        """The conversation's state, or (None) ``{"conversations": [...]}``."""
        return self.request("state", {"conversation": conversation} if conversation else {})

    def events(self, conversation: str, after: int = 0) -> Iterator[Event]:
        """The sealed SSE stream of ``conversation`` from ``after`` (the resume seq), opened.

        Each frame must open with the associated data of this stream and of the seq that
        follows the last one received; the iterator ends when the gateway ends the stream.

        Raises:
            E2ERefused: the stream was refused (plain error: unknown/revoked device...).
            E2EError: a frame is unsealed (downgrade) or does not open in its place.
        """
        stream = secrets.token_urlsafe(16)
        with self._sending:
            _, wire = self._sealed_request(
                "chat", {"conversation": conversation, "after": after, "stream": stream}
            )
            params = {"device": wire["device"], "nonce": wire["nonce"], "ct": wire["ct"]}
            headers = {"Last-Event-ID": str(after), "Accept": "text/event-stream"}
            opening = self.http.build_request(
                "GET", "/api/e2e/chat", params=params, headers=headers
            )
            response = self.http.send(opening, stream=True)
        last = after
        try:
            if response.status_code != 200:
                response.read()
                try:
                    error = response.json().get("error", {})
                except ValueError:
                    error = {"message": response.text[:200]}
                raise E2ERefused(response.status_code, error, sealed=False)
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                raise E2EError("downgrade: the stream is not an event stream")
            fields: dict[str, str] = {}
            for line in response.iter_lines():
                if line:
                    name, _, value = line.partition(":")
                    if name:
                        fields[name] = value[1:] if value.startswith(" ") else value
                    continue
                if "data" not in fields:
                    fields = {}
                    continue
                name = fields.get("event", "message")
                raw_id = fields.get("id", "")
                if name == "message" and not _SEQ.fullmatch(raw_id):
                    raise E2EError(
                        f"an event without a seq id ({raw_id[:20]!r}): not the e2e stream"
                    )
                seq = int(raw_id) if name == "message" else last
                aad = env.aad(self.device, "chat", "event", conversation, stream, name, seq, last)
                try:
                    data = env.open_payload(self.key, env.parse(json.loads(fields["data"])), aad)
                except (ValueError, env.EnvelopeError) as exc:
                    raise E2EError(
                        f"event at seq {seq} is not sealed for this stream in this place "
                        f"(downgrade, tampered, replayed, reordered or moved): {exc}"
                    ) from exc
                fields = {}
                last = seq
                yield Event(seq, name, data)

        finally:
            response.close()


def _text(event: Event) -> str:
    choices = event.data.get("choices") or [{}]
    delta = choices[0].get("delta") or {}
    return delta.get("content") or ""


def _stream_turn(client: E2EClient, conversation: str, last: int) -> None:
    """Print the turn's answer as it streams from seq ``last`` on, resuming from the last
    seq received whenever the stream ends before the turn does (a cut, ``reconnect``)."""
    while True:
        for event in client.events(conversation, last):
            last = event.seq
            if event.name != "message":
                continue
            delta = (event.data.get("choices") or [{}])[0].get("delta") or {}
            if delta.get("role") not in ("user", "tool"):
                print(_text(event), end="", flush=True)
            if (event.data.get("choices") or [{}])[0].get("finish_reason"):
                print()
                return
        time.sleep(1.0)


def chat(
    code: str = typer.Option(
        ..., "--code", help="The pairing code shown when the device was made."
    ),
    url: str = typer.Option(..., "--url", help="Base URL of the relay (or of Loki itself)."),
    conversation: str | None = typer.Option(None, "--conversation", help="Continue this one."),
    message: list[str] = typer.Option([], "--message", "-m", help="Send these, then exit."),
) -> None:
    """Chat end to end encrypted: each line you type is a turn; the answer streams back."""
    client = E2EClient(code, url)
    try:
        lines = iter(message) if message else iter(lambda: input("> "), "/quit")
        for line in lines:
            if not line.strip():
                continue
            last = client.state(conversation)["last_seq"] if conversation else 0
            conversation = client.send(line, conversation)["conversation"]
            _stream_turn(client, conversation, last)
    except (E2EError, E2ERefused) as exc:
        typer.echo(f"e2e: {exc}", err=True)
        raise typer.Exit(1) from exc
    except EOFError:
        pass
    finally:
        client.close()


def register(app: typer.Typer) -> None:
    """Add ``loki e2e chat`` to the CLI."""
    group = typer.Typer(help="End-to-end encrypted access through an untrusted relay.")
    group.command("chat")(chat)
    app.add_typer(group, name="e2e")
