"""Presets in Redis, the external key sealed, and the connection test of an external preset.

Redis layout:

- ``loki:engine:presets`` (hash): preset id → preset JSON; an external key is stored only as
  ``api_key_sealed`` (base64 of an AES-GCM blob, associated data
  ``loki:engine:preset:<id>:api_key``), never in clear.
- ``loki:engine:active``: the active preset's id.

The ``env`` preset is built from the ``LOKI_*`` settings; a stored preset with that id
overrides it; deleting it brings the settings back.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError
from redis.asyncio import Redis

from loki_shared.messages.engine import Preset
from loki_shared.sealing import Sealer, SealError

from .errors import InvalidRequest, NotFound
from .settings import Settings

PRESETS_KEY = "loki:engine:presets"
ACTIVE_KEY = "loki:engine:active"
ENV_PRESET_ID = "env"
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _aad(preset_id: str) -> bytes:
    return f"loki:engine:preset:{preset_id}:api_key".encode()


def public(preset: Preset) -> dict[str, Any]:
    """The preset as the API shows it: ``api_key`` never included."""
    data = preset.model_dump()
    data["api_key"] = None
    return data


def validate(preset: Preset) -> None:
    """Check a preset's fields.

    Raises:
        InvalidRequest: bad id, missing model or draft model file, CTX, NGL, UBATCH, CACHE_RAM,
            SLOT_PERSIST_MAX_MB, DRAFT_MAX/DRAFT_MIN/DRAFT_NGL, a CHAT_TEMPLATE_FILE that
            is not a file, external preset without ``base_url`` or ``api_model``.
    """
    if not _ID.match(preset.id):
        raise InvalidRequest(
            "preset id: 1-64 of A-Z, a-z, 0-9, '-' or '_' (or none: one is made); the preset's "
            "name, shown in the picker, may be written in any script"
        )
    if preset.max_tokens is not None and preset.max_tokens < 1:
        raise InvalidRequest("max_tokens must be at least 1 token (or unset)")
    if preset.external:
        if not re.match(r"^https?://", preset.base_url or ""):
            raise InvalidRequest("external preset: base_url must start with http:// or https://")
        if not preset.api_model:
            raise InvalidRequest("external preset: api_model is required")
        return
    if preset.model and not Path(preset.model).is_file():
        raise InvalidRequest(f"model file not found: {preset.model}")
    if preset.ctx < 256:
        raise InvalidRequest("CTX must be at least 256 tokens")
    ngl = (preset.ngl or "").strip().lower()
    if ngl not in ("", "auto", "all") and not ngl.lstrip("-").isdigit():
        raise InvalidRequest("NGL: auto, all, 999 or a number of layers")
    if preset.parallel is not None and preset.parallel < 1:
        raise InvalidRequest("PARALLEL must be at least 1")
    if preset.ubatch is not None and preset.ubatch < 1:
        raise InvalidRequest("UBATCH must be at least 1 token (or unset)")
    if preset.draft_model and not Path(preset.draft_model).is_file():
        raise InvalidRequest(f"draft model file not found: {preset.draft_model}")
    for name, value in (("DRAFT_MAX", preset.draft_max), ("DRAFT_MIN", preset.draft_min)):
        if value is not None and value < 0:
            raise InvalidRequest(f"{name} must be at least 0 tokens")
    if (
        preset.draft_max is not None
        and preset.draft_min is not None
        and preset.draft_min > preset.draft_max
    ):
        raise InvalidRequest("DRAFT_MIN must not exceed DRAFT_MAX")
    dngl = (preset.draft_ngl or "").strip().lower()
    if dngl not in ("", "auto", "all") and not dngl.lstrip("-").isdigit():
        raise InvalidRequest("DRAFT_NGL: auto, all or a number of layers")
    template = (preset.features.get("CHAT_TEMPLATE_FILE") or "").strip()
    if template and not Path(template).is_file():
        raise InvalidRequest(f"CHAT_TEMPLATE_FILE: file not found: {template}")
    persist_mb = (preset.features.get("SLOT_PERSIST_MAX_MB") or "").strip()
    if persist_mb and not persist_mb.isdigit():
        raise InvalidRequest("SLOT_PERSIST_MAX_MB: empty (2048) or MiB")
    cram = (preset.features.get("CACHE_RAM") or "").strip().lower()
    if cram not in ("", "auto"):
        try:
            if int(cram) < -1:
                raise ValueError
        except ValueError as exc:
            raise InvalidRequest("CACHE_RAM: empty, auto, -1, 0 or MiB") from exc


#: Share of the window one completion step may fill on a local engine when the preset
#: does not say (issue 23: a reply never fills the window by itself).
STEP_SHARE = 4


def step_cap(preset: Preset, n_ctx: int) -> int | None:
    """``max_tokens`` of each completion step under ``preset`` (tokens): the preset's own
    value when set; else a quarter of the window ``n_ctx`` for a local engine (at least 1),
    and none for an external preset (its API has its own default)."""
    if preset.max_tokens is not None:
        return preset.max_tokens
    if preset.external or n_ctx <= 0:
        return None
    return max(1, n_ctx // STEP_SHARE)


class PresetStore:
    """Presets in Redis (see the module docstring).

    Args:
        redis: an asyncio Redis client (``decode_responses=False``).
        sealer: the service sealer (seals external keys).
        env_preset: the preset built from the settings (id ``env``).
    """

    def __init__(self, redis: Redis, sealer: Sealer, env_preset: Preset) -> None:
        self.redis = redis
        self.sealer = sealer
        self.env_preset = env_preset

    def _decode(self, raw: bytes) -> Preset:
        data = json.loads(raw)
        sealed = data.pop("api_key_sealed", None)
        preset = Preset.model_validate(data)
        preset.api_key = None
        preset.api_key_set = bool(sealed)
        return preset

    async def list(self) -> list[Preset]:
        """Every preset (stored ones and ``env`` if not overridden), by id; keys not in clear."""
        raw = await self.redis.hgetall(PRESETS_KEY)
        presets = {k.decode(): self._decode(v) for k, v in raw.items()}
        presets.setdefault(ENV_PRESET_ID, self.env_preset.model_copy())
        return [presets[k] for k in sorted(presets)]

    async def get(self, preset_id: str) -> Preset:
        """One preset, key not in clear.

        Raises:
            NotFound: no such preset.
        """
        raw = await self.redis.hget(PRESETS_KEY, preset_id)
        if raw is None:
            if preset_id == ENV_PRESET_ID:
                return self.env_preset.model_copy()
            raise NotFound(f"no preset {preset_id!r}")
        return self._decode(raw)

    async def api_key(self, preset_id: str) -> str | None:
        """The external preset's key in clear (internal use: the lease, the test).

        Raises:
            NotFound: no such preset.
        """
        raw = await self.redis.hget(PRESETS_KEY, preset_id)
        if raw is None:
            if preset_id == ENV_PRESET_ID:
                return None
            raise NotFound(f"no preset {preset_id!r}")
        sealed = json.loads(raw).get("api_key_sealed")
        if not sealed:
            return None
        try:
            return self.sealer.open(base64.b64decode(sealed), _aad(preset_id)).decode()
        except SealError:
            return None

    async def save(self, data: dict[str, Any]) -> Preset:
        """Create or update a preset from the API's fields. A missing id creates one. An
        empty or missing ``api_key`` keeps the stored key; a non-empty one replaces it
        (sealed). Returns the stored preset (key not in clear).

        Raises:
            InvalidRequest: malformed fields.
        """
        try:
            preset = Preset.model_validate(data)
        except ValidationError as exc:
            raise InvalidRequest(f"bad preset: {exc.errors()[:1]}") from exc
        if not preset.id:
            preset.id = uuid.uuid4().hex[:12]
        if not preset.name:
            preset.name = preset.id
        validate(preset)
        stored = preset.model_dump(exclude={"api_key", "api_key_set"})
        old = await self.redis.hget(PRESETS_KEY, preset.id)
        old_sealed = json.loads(old).get("api_key_sealed") if old else None
        if preset.api_key:
            blob = self.sealer.seal(preset.api_key.encode(), _aad(preset.id))
            stored["api_key_sealed"] = base64.b64encode(blob).decode()
        elif old_sealed:
            stored["api_key_sealed"] = old_sealed
        await self.redis.hset(PRESETS_KEY, preset.id, json.dumps(stored))
        return await self.get(preset.id)

    async def delete(self, preset_id: str) -> None:
        """Delete a stored preset.

        Raises:
            NotFound: no stored preset with that id.
        """
        if not await self.redis.hdel(PRESETS_KEY, preset_id):
            raise NotFound(f"no stored preset {preset_id!r}")

    async def active_id(self) -> str:
        """The active preset's id (``env`` when none was switched to, or it was deleted)."""
        raw = await self.redis.get(ACTIVE_KEY)
        if raw:
            pid = raw.decode()
            if pid == ENV_PRESET_ID or await self.redis.hexists(PRESETS_KEY, pid):
                return pid
        return ENV_PRESET_ID

    async def set_active(self, preset_id: str) -> None:
        await self.redis.set(ACTIVE_KEY, preset_id)


def api_error_message(response: httpx.Response) -> str:
    """The API's own error message from an error response: OpenAI's ``error.message``,
    else ``message``/``detail``/``error`` (text), else the body's start."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("message", "detail", "error"):
            if isinstance(body.get(key), str) and body[key]:
                return body[key]
    return json.dumps(body)[:300]


async def test_connection(
    base_url: str, api_key: str | None, model: str, timeout: float = 10.0
) -> dict[str, Any]:
    """Test an external preset: ``GET <base>/v1/models`` with its key.

    Returns ``{"ok", "status", "message", "models"}``: ``message`` is the API's own error
    message on failure (see :func:`api_error_message`), or says whether ``model`` is listed.
    Never raises for network errors (they are reported in ``message``).
    """
    root = base_url.rstrip("/")
    url = f"{root}/models" if root.endswith("/v1") else f"{root}/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            r = await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        return {
            "ok": False,
            "status": None,
            "message": f"{exc.__class__.__name__}: {exc}",
            "models": [],
        }
    if r.status_code != 200:
        return {"ok": False, "status": r.status_code, "message": api_error_message(r), "models": []}
    try:
        models = [str(m.get("id")) for m in r.json().get("data", []) if isinstance(m, dict)]
    except (ValueError, AttributeError):
        models = []
    if model and models and model not in models:
        msg = f"connected; model {model!r} not in the API's list"
    else:
        msg = "connected"
    return {"ok": True, "status": 200, "message": msg, "models": models[:200]}


def env_preset(settings: Settings) -> Preset:
    """The ``env`` preset: the local engine as the ``LOKI_*`` settings describe it."""
    return Preset(
        id=ENV_PRESET_ID,
        name="Local engine (environment)",
        model=settings.model,
        ctx=settings.ctx,
        ngl=settings.ngl,
        parallel=settings.parallel,
        ubatch=settings.ubatch,
        extra_args=settings.extra_args,
        features={
            "SIDE_SLOT": settings.side_slot,
            "CACHE_RAM": settings.cache_ram,
            "CACHE_ISOLATE": settings.cache_isolate,
            "SLOT_PERSIST": settings.slot_persist,
            "SLOT_PERSIST_MAX_MB": settings.slot_persist_max_mb,
            "CHAT_TEMPLATE_FILE": settings.chat_template_file,
            **tail_reuse_features(settings),
        },
        draft_model=settings.draft_model,
        draft_max=settings.draft_max,
        draft_min=settings.draft_min,
        draft_ngl=settings.draft_ngl,
    )


def tail_reuse_features(settings: Settings) -> dict[str, str]:
    """The ``env`` preset's COMPACT_TAIL_REUSE features: ``COMPACT_TAIL_REUSE: on`` and
    ``CACHE_REUSE`` (tokens) when the key is on; none when off (the preset as before)."""
    if not settings.compact_tail_reuse:
        return {}
    return {"COMPACT_TAIL_REUSE": "on", "CACHE_REUSE": str(settings.cache_reuse)}


def model_source(preset: Preset) -> str:
    """Where a preset's model path comes from, as a person would fix it: ``LOKI_MODEL``
    for the environment's preset, else the preset's name and id."""
    if preset.id == ENV_PRESET_ID:
        return "LOKI_MODEL"
    return f"model of preset {preset.name!r} ({preset.id})"
