"""The ``/v1`` routes: models (list and one), chat completions, Responses, completions,
embeddings, and ``/slots`` refused.

Each completion or embeddings route reads and checks the body (:mod:`.protocol`) and returns
an :class:`.exchange.Exchange`, which holds the engine lease for the whole answer.
"""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from loki_shared import subjects
from loki_shared.messages.engine import EngineInfo, EngineInfoRequest
from loki_shared.sse import json_object

from ...bus import Bus
from ...deps import get_bus
from ...errors import MethodNotAllowed, NotFound, ServiceUnavailable
from ...media_urls import check_media
from .exchange import Exchange, Mode, join_url
from .protocol import (
    CHAT_SCHEMA,
    COMPLETION_SCHEMA,
    EMBED_SCHEMA,
    RESPONSES_SCHEMA,
    engine_error,
    models_reply,
    normalise_chat,
    normalise_completion,
    normalise_embeddings,
    normalise_responses,
    parse_object,
)

router = APIRouter(tags=["openai"])
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def _body_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


async def _read_body(request: Request) -> dict[str, Any]:
    return parse_object(await request.body())


async def _models(request: Request, bus: Bus) -> tuple[Any, Response | None]:
    """The model list: ``(payload, None)``; or ``(payload or None, answer)`` when the
    engine's answer is passed on as it is (an error, an external API's list, not an
    object)."""
    info = await bus.request_ok(subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo)
    if info.state != "ready" or not info.base_url:
        raise ServiceUnavailable(f"engine is {info.state}", code="engine_not_ready")
    headers = {"Authorization": f"Bearer {info.api_key}"} if info.api_key else {}
    try:
        resp = await request.app.state.http.get(
            join_url(info.base_url, "/v1/models"), headers=headers, timeout=10
        )
    except httpx.HTTPError as exc:
        raise ServiceUnavailable(f"engine unreachable: {type(exc).__name__}") from exc
    if resp.status_code != 200:
        status, err = engine_error(resp.status_code, resp.content)
        return None, JSONResponse(err, status_code=status)
    payload = json_object(resp.content)
    if payload is None or info.external:  # an external API's list: as it is
        return payload, Response(content=resp.content, media_type="application/json")
    return models_reply(payload), None


@router.get("/v1/models")
async def models(request: Request, bus: Bus = Depends(get_bus)) -> Any:
    """The engine's ``/v1/models`` (no lease needed: it does not use a slot), each local
    model id and alias made its file name (:func:`.protocol.models_reply`); an external API's
    list is passed as it is."""
    payload, answer = await _models(request, bus)
    return answer if answer is not None else JSONResponse(payload)


@router.get("/v1/models/{model:path}")
async def model(model: str, request: Request, bus: Bus = Depends(get_bus)) -> Any:
    """One model of ``/v1/models`` by its listed id (OpenAI's retrieve): the list's entry;
    an id the list does not hold is 404 ``model_not_found`` (``param: "model"``)."""
    payload, answer = await _models(request, bus)
    if payload is None and answer is not None and answer.status_code != 200:
        return answer
    data = payload.get("data") if isinstance(payload, dict) else None
    for item in data if isinstance(data, list) else []:
        if isinstance(item, dict) and item.get("id") == model:
            return JSONResponse(item)
    raise NotFound(
        f"the model {model!r} does not exist: GET /v1/models lists the ids served",
        code="model_not_found",
        param="model",
    )


@router.post("/v1/chat/completions", openapi_extra=_body_schema(CHAT_SCHEMA))
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions, streamed or not (a non-streamed one is asked streamed
    upstream and assembled)."""
    body = normalise_chat(await _read_body(request))
    await check_media(body, "messages", request.app.state.image_policy, request.app.state.http)
    mode: Mode = "stream" if body.get("stream") else "assemble"
    return Exchange(request, "/v1/chat/completions", body, mode, perf=True)


@router.post("/v1/responses", openapi_extra=_body_schema(RESPONSES_SCHEMA))
async def responses(request: Request) -> Response:
    """OpenAI's Responses API, streamed or not (:mod:`.responses`: asked streamed upstream,
    a non-streamed answer is the ``response`` of ``response.completed``)."""
    body = normalise_responses(await _read_body(request))
    await check_media(body, "input", request.app.state.image_policy, request.app.state.http)
    mode: Mode = "responses_stream" if body.get("stream") else "responses"
    return Exchange(request, "/v1/responses", body, mode, perf=True)


@router.post("/v1/completions", openapi_extra=_body_schema(COMPLETION_SCHEMA))
async def completions(request: Request) -> Response:
    """OpenAI (legacy) completions, streamed or not (as for chat completions)."""
    body = normalise_completion(await _read_body(request))
    mode: Mode = "stream" if body.get("stream") else "assemble"
    return Exchange(request, "/v1/completions", body, mode, perf=True)


@router.post("/v1/embeddings", openapi_extra=_body_schema(EMBED_SCHEMA))
async def embeddings(request: Request) -> Response:
    """OpenAI embeddings, passed through when the engine serves them (llama-server started
    with ``--embeddings``; otherwise its 501 is relayed in OpenAI's shape)."""
    body = normalise_embeddings(await _read_body(request))
    body.pop("stream", None)
    return Exchange(request, "/v1/embeddings", body, "json", perf=False)


@router.api_route("/v1/slots", methods=ALL_METHODS, include_in_schema=False)
@router.api_route("/v1/slots/{rest:path}", methods=ALL_METHODS, include_in_schema=False)
@router.api_route("/slots", methods=ALL_METHODS, include_in_schema=False)
@router.api_route("/slots/{rest:path}", methods=ALL_METHODS, include_in_schema=False)
async def slots_refused(request: Request) -> Response:
    """Slot save/restore/erase is the supervisor's alone: any ``/slots`` path is 405."""
    raise MethodNotAllowed(f"{request.url.path} is not available through the gateway")
