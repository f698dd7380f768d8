"""Opening a device's sealed request and sealing the answer to it (the e2e routes' gate).

A request is authenticated by its envelope alone (no API key): the device id names the key,
the envelope must open under it with the associated data of this route and direction
``request``, and the payload ``{"counter": int, "body": {...}}`` must carry a counter above
the last one accepted from the device. Any failure is a plain OpenAI-shaped error (nothing is
sealed for a requester who has not proven the key) and nothing is processed:

- 400 ``invalid_envelope``: not an envelope (bad base64, wrong nonce length, ``v`` not 1,
  JSON nested too deeply), or a payload without an integer counter in 1..2^53-1 and an
  object body;
- 401 ``invalid_device``: unknown or revoked device, or an id not of the form
  ``dev_<16 hex>``;
- 401 ``envelope_rejected``: does not open (wrong key, a tampered byte, another route);
- 409 ``replayed_request``: the counter is not above the last accepted one.

Everything after that, errors included, is answered sealed (:func:`sealed_json`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from loki_shared import e2e_envelope as env
from loki_shared.errors import LokiError

from ..deps import sealed_store
from ..errors import BadRequest
from .devices import DeviceStore

#: The largest counter accepted (JavaScript's safe integers: the PWA counts too).
MAX_COUNTER = 2**53 - 1


class EnvelopeRejected(LokiError):
    """401 ``envelope_rejected``: the envelope does not open under the device's key."""

    http_status = 401
    openai_type = "invalid_request_error"
    code = "envelope_rejected"


class ReplayedRequest(LokiError):
    """409 ``replayed_request``: a request counter not above the last accepted one."""

    http_status = 409
    openai_type = "invalid_request_error"
    code = "replayed_request"


def devices(request: Request) -> DeviceStore:
    """The app's :class:`DeviceStore` (built on first use from the memory state's Redis and
    the service key).

    Raises:
        ServiceUnavailable: Redis is not reached yet.
    """
    return sealed_store(request, "e2e_devices", lambda redis, sealer, _: DeviceStore(redis, sealer))


@dataclass
class Opened:
    """An authenticated request: the device, its key, the request counter and the body."""

    device: str
    key: bytes
    counter: int
    body: dict[str, Any]
    route: str

    def seal(self, payload: Any) -> dict[str, Any]:
        """``payload`` sealed as this request's response (associated data: device, route,
        ``response``, counter)."""
        return env.seal(
            self.key,
            self.device,
            payload,
            env.aad(self.device, self.route, "response", self.counter),
        )


async def open_request(request: Request, route: str, wire: Any) -> Opened:
    """Authenticate and open the sealed request ``wire`` (the envelope object) for ``route``
    (``send``, ``control``, ``state``, ``chat``); see the module docstring for the refusals.
    """
    try:
        envelope = env.parse(wire)
    except env.EnvelopeError as exc:
        raise BadRequest(f"{exc}: send the request sealed", code="invalid_envelope") from exc
    store = devices(request)
    key = await store.key(envelope.device)
    try:
        payload = env.open_payload(key, envelope, env.aad(envelope.device, route, "request"))
    except env.EnvelopeError as exc:
        if exc.malformed:
            raise BadRequest(f"{exc}: send the request sealed", code="invalid_envelope") from exc
        raise EnvelopeRejected(
            "the request does not open under this device's key (tampered, or another key)"
        ) from exc
    counter = payload.get("counter") if isinstance(payload, dict) else None
    body = payload.get("body") if isinstance(payload, dict) else None
    # bool is an int in Python (and JSON true would pass as 1): refused like a float or text.
    if (
        not isinstance(counter, int)
        or isinstance(counter, bool)
        or not 0 < counter <= MAX_COUNTER
        or not isinstance(body, dict)
    ):
        raise BadRequest(
            f"sealed payload must be {{counter: integer 1..{MAX_COUNTER}, body: object}}",
            code="invalid_envelope",
        )
    if not await store.accept_counter(envelope.device, counter):
        raise ReplayedRequest(
            "request counter not above the last one accepted: a replay, or another client "
            "of this device sent a later request (give each client its own device)"
        )
    await store.seen(envelope.device)
    return Opened(envelope.device, key, counter, body, route)


def sealed_json(opened: Opened, status: int, body: Any) -> JSONResponse:
    """The sealed answer: HTTP ``status`` (the relay sees it) and an envelope of
    ``{"status", "body"}``."""
    return JSONResponse(opened.seal({"status": status, "body": body}), status_code=status)
