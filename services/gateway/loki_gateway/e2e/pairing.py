"""Pairing: ``/api/e2e/devices`` (behind the API key like every ``/api`` route): create a
device (its key, text code and QR code answered once), list, rename, revoke.

Without ``LOKI_API_KEY`` no device is created (403 ``api_key_required``): the gateway then
trusts whatever reaches it, a tunnel or relay client on the same machine included, and such a
relay could pair itself (the source address cannot tell it from the person: a tunnel on the
box connects from loopback too)."""

from __future__ import annotations

import io
from typing import Annotated, Any

import segno
from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from loki_shared import e2e_envelope as env
from loki_shared.errors import Forbidden

from .devices import MAX_NAME
from .sealed import devices

router = APIRouter(tags=["e2e"])

DevicePath = Annotated[str, Path(pattern=r"^dev_[0-9a-f]{16}$", description="Device id.")]


class DeviceBody(BaseModel):
    """``POST`` / ``PATCH /api/e2e/devices``: the device's name, as the list shows it."""

    name: str = Field(min_length=1, max_length=MAX_NAME)


def _qr_svg(code: str) -> str:
    out = io.BytesIO()
    segno.make(code, error="m").save(out, kind="svg", scale=4, border=2, xmldecl=False)
    return out.getvalue().decode()


@router.post("/api/e2e/devices", status_code=201)
async def devices_create(body: DeviceBody, request: Request) -> Any:
    """Pair a device: 201 ``{"device": {...}, "key", "code", "qr_svg"}``. The key (base64url,
    32 bytes), the text code holding the device id and key, and the code as a QR (SVG) are
    given this once; no route returns them again.

    Raises:
        Forbidden: 403 ``api_key_required``: no ``LOKI_API_KEY`` is set (module docstring).
    """
    if request.app.state.settings.key() is None:
        raise Forbidden(
            "pairing needs LOKI_API_KEY: without it anything that reaches Loki, a relay or "
            "tunnel on this machine too, could pair itself. Set LOKI_API_KEY, restart Loki "
            "and pair again",
            code="api_key_required",
        )
    device, key = await devices(request).create(body.name)
    code = env.pairing_code(device.id, key, request.scope.get("root_path", ""))
    return JSONResponse(
        {"device": device.public(), "key": env.b64e(key), "code": code, "qr_svg": _qr_svg(code)},
        status_code=201,
        headers={"Cache-Control": "no-store"},
    )


@router.get("/api/e2e/devices")
async def devices_list(request: Request) -> Any:
    """``{"devices": [{"id", "name", "created", "last_seen", "revoked"}]}`` (no keys)."""
    return {"devices": [d.public() for d in await devices(request).list()]}


@router.patch("/api/e2e/devices/{device}")
async def devices_rename(device: DevicePath, body: DeviceBody, request: Request) -> Any:
    """Rename: ``{"device": {...}}``; 404 for an unknown id."""
    return {"device": (await devices(request).rename(device, body.name)).public()}


@router.delete("/api/e2e/devices/{device}")
async def devices_revoke(device: DevicePath, request: Request) -> Any:
    """Revoke: its key is deleted; its requests are refused and its open streams end
    (within :data:`loki_gateway.e2e.stream.CHECK_S`). ``{"device": {...}}``."""
    return {"device": (await devices(request).revoke(device)).public()}
