"""The end-to-end envelope of a paired device (issue 45): AES-256-GCM under the device key.

Every request body, response body and SSE event data on the ``/api/e2e/*`` routes is one
envelope, a JSON object::

    {"v": 1, "device": "<device id>", "nonce": "<base64url, 12 bytes>", "ct": "<base64url>"}

``ct`` is the AES-GCM ciphertext with its 16-byte tag; the plaintext is compact UTF-8 JSON.

**Associated data** (:func:`aad`): the JSON array ``["loki-e2e", 1, device, route,
direction, *context]`` (JSON, so no field can run into the next). ``direction`` is
``request``, ``response`` or ``event``; ``context`` is, for a response, the request's counter
(a response answers one request only), and for an event the conversation, the stream id the
client chose when it opened the stream, the event's name, its seq and the seq sent just
before it on that stream. An envelope moved to another device, route, direction,
conversation, stream or position therefore fails to open, and so does one dropped, repeated
or reordered (the next event's "previous seq" no longer matches what the client holds). A
request's counter travels inside its sealed payload (authenticated with it); the gateway
refuses a counter not above the last one it accepted from the device (replay).

**Nonces**: 96 bits from the operating system's CSPRNG, drawn afresh for every envelope, by
the gateway and by the device alike (both hold the key, so a shared counter would need
coordination, and a direction-split counter would have to survive restarts on both sides).
NIST SP 800-38D bounds random 96-bit nonces to 2**32 envelopes per key (collision probability
then under 2**-32). That is the documented limit of a device key, both directions together:
about 4.3 billion envelopes, i.e. ten events a second around the clock for thirteen years
(a replay re-seals the events it sends, so it counts too); pair the device again (a new key)
long before that.

Pure functions only: no I/O, no clocks.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

VERSION = 1
KEY_BYTES = 32
NONCE_BYTES = 12
#: Prefix of a pairing code (:func:`pairing_code`).
CODE_PREFIX = "loki-e2e1:"
DIRECTIONS = ("request", "response", "event")


class EnvelopeError(Exception):
    """An envelope is malformed (``malformed`` True: not an envelope, bad base64, not JSON
    inside) or does not open under the key with the expected associated data (wrong key,
    tampered, replayed, moved to another place)."""

    def __init__(self, message: str, malformed: bool = False) -> None:
        super().__init__(message)
        self.malformed = malformed


def b64e(raw: bytes) -> str:
    """Unpadded base64url text of ``raw``."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64d(text: str) -> bytes:
    """Bytes of an (unpadded or padded) base64url text.

    Raises:
        ValueError: not base64url.
    """
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not base64url") from exc


def aad(device: str, route: str, direction: str, *context: str | int) -> bytes:
    """The associated data (see the module docstring): UTF-8 JSON of
    ``["loki-e2e", 1, device, route, direction, *context]``."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}")
    return json.dumps(
        ["loki-e2e", VERSION, device, route, direction, *context], separators=(",", ":")
    ).encode()


@dataclass(frozen=True)
class Envelope:
    """A parsed envelope: ``nonce`` 12 bytes, ``ct`` ciphertext with its tag."""

    device: str
    nonce: bytes
    ct: bytes

    def to_json(self) -> dict[str, Any]:
        """The wire object ``{"v", "device", "nonce", "ct"}``."""
        return {"v": VERSION, "device": self.device, "nonce": b64e(self.nonce), "ct": b64e(self.ct)}


def parse(obj: Any) -> Envelope:
    """Read the wire object.

    Raises:
        EnvelopeError (malformed): not an object of version 1 with a string device, a
            12-byte nonce and a ciphertext of at least a tag.
    """
    if not isinstance(obj, dict) or obj.get("v") != VERSION:
        raise EnvelopeError("not a sealed envelope (v 1)", malformed=True)
    device, nonce, ct = obj.get("device"), obj.get("nonce"), obj.get("ct")
    if not isinstance(device, str) or not isinstance(nonce, str) or not isinstance(ct, str):
        raise EnvelopeError("envelope needs string device, nonce and ct", malformed=True)
    try:
        raw_nonce, raw_ct = b64d(nonce), b64d(ct)
    except ValueError as exc:
        raise EnvelopeError("envelope nonce/ct are not base64url", malformed=True) from exc
    if len(raw_nonce) != NONCE_BYTES or len(raw_ct) < 16:
        raise EnvelopeError("envelope nonce or ct has the wrong length", malformed=True)
    return Envelope(device, raw_nonce, raw_ct)


def seal(key: bytes, device: str, payload: Any, associated: bytes) -> dict[str, Any]:
    """Seal ``payload`` (JSON-able) for ``device`` under ``key`` (32 bytes) with a fresh
    random nonce; returns the wire object."""
    nonce = os.urandom(NONCE_BYTES)
    plain = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    return Envelope(device, nonce, AESGCM(key).encrypt(nonce, plain, associated)).to_json()


def open_payload(key: bytes, envelope: Envelope, associated: bytes) -> Any:
    """The JSON payload of ``envelope``.

    Raises:
        EnvelopeError: does not open (wrong key, tampered, other associated data) or the
            plaintext is not UTF-8 JSON.
    """
    try:
        plain = AESGCM(key).decrypt(envelope.nonce, envelope.ct, associated)
    except InvalidTag as exc:
        raise EnvelopeError("envelope does not open under the device key here") from exc
    return loads(plain, "sealed payload")


def loads(raw: bytes | str, what: str) -> Any:
    """JSON of ``raw`` (UTF-8), with a JSON too deeply nested to parse counted as malformed.

    Raises:
        EnvelopeError (malformed): not UTF-8 JSON, or nested deeper than the parser allows.
    """
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise EnvelopeError(f"{what} is not UTF-8 JSON", malformed=True) from exc
    except RecursionError as exc:
        raise EnvelopeError(f"{what} is JSON nested too deeply", malformed=True) from exc


def pairing_code(device: str, key: bytes, base: str = "") -> str:
    """The text code a person pastes into a client: ``loki-e2e1:`` + base64url of
    ``{"d": device, "k": base64url key, "b": base path or ""}``."""
    body = json.dumps({"d": device, "k": b64e(key), "b": base}, separators=(",", ":"))
    return CODE_PREFIX + b64e(body.encode())


def read_code(code: str) -> tuple[str, bytes, str]:
    """``(device, key, base)`` of a :func:`pairing_code` text.

    Whitespace anywhere in it (a code wrapped over lines, or pasted with spaces) is ignored:
    the code's alphabet (base64url) has none.

    Raises:
        ValueError: not such a code (says what was expected).
    """
    text = "".join(code.split())
    if not text.startswith(CODE_PREFIX):
        raise ValueError(f"a pairing code starts with {CODE_PREFIX!r}")
    try:
        obj = json.loads(b64d(text[len(CODE_PREFIX) :]))
        device, key, base = obj["d"], b64d(obj["k"]), obj.get("b", "")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError("the pairing code is damaged: copy it again") from exc
    if not isinstance(device, str) or len(key) != KEY_BYTES or not isinstance(base, str):
        raise ValueError("the pairing code is damaged: copy it again")
    return device, key, base
