"""Attachment routes: ``POST /api/chat/upload`` and ``GET /api/chat/attachment/{id}``, and
:func:`expand`, which turns a send's ``attachments`` into inlined text and image parts.

Both routes are under ``/api`` (behind ``LOKI_API_KEY`` when set). The rules of what is
accepted and how it is stored are in :mod:`loki_gateway.attachments`.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, UploadFile
from fastapi.responses import Response

from loki_shared import subjects
from loki_shared.messages.chat import ImageAttachment
from loki_shared.messages.engine import EngineInfo, EngineInfoRequest
from loki_shared.permissions import MAX_PAYLOAD

from ..attachments import ID_PATTERN, AttachmentStore, TooLarge, clean_name, fenced
from ..bus import Bus
from ..deps import sealed_store
from ..errors import BadRequest

router = APIRouter(tags=["attachments"])

#: Attachments one message may carry.
MAX_PER_MESSAGE = 8


class VisionUnavailable(BadRequest):
    """400: an image was sent to a model that cannot see images."""

    code = "vision_unavailable"


def store(request: Request) -> AttachmentStore:
    """The app's :class:`~loki_gateway.attachments.AttachmentStore` (built on first use from
    the memory state's Redis and key).

    Raises:
        ServiceUnavailable: Redis is not reached yet (the memory state is not started).
    """
    return sealed_store(
        request,
        "attachments",
        lambda redis, sealer, memory: AttachmentStore(redis, sealer, memory.key),
    )


@router.post("/api/chat/upload", status_code=201)
async def upload(request: Request, file: UploadFile) -> Any:
    """Store one file (multipart field ``file``): 201 with ``{"id", "name", "kind", "mime",
    "size"}``. 413 over ``LOKI_UPLOAD_MAX_MB``, 415 for a type not accepted (by content), 422
    for an accepted type its parser cannot read (every refusal names the file; nothing is
    stored), 423 while an encrypted memory is locked."""
    limit = int(request.app.state.settings.upload_max_mb * 1024 * 1024)
    raw = await file.read(limit + 1)
    name = clean_name(file.filename)
    if len(raw) > limit:
        raise TooLarge(
            f"{name!r} is over the upload limit of "
            f"{request.app.state.settings.upload_max_mb:g} MB (LOKI_UPLOAD_MAX_MB)"
        )
    if not raw:
        raise BadRequest(f"{name!r} is empty", code="empty_file")
    att = await store(request).put(file.filename or "", raw)
    return att.meta()


@router.get("/api/chat/attachment/{att_id}")
async def attachment(
    request: Request,
    att_id: Annotated[str, Path(pattern=ID_PATTERN, description="Attachment id.")],
    conversation: Annotated[
        str | None,
        Query(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="The conversation it is read in."),
    ] = None,
) -> Response:
    """The attachment's content (an image's bytes with its type; a text file's text, a PDF's
    extracted text, as ``text/plain``) for the UI's thumbnails; its 24 h expiry starts
    again. 404 when gone, or when ``conversation`` is not the one it belongs to."""
    if conversation is not None:
        await store(request).check_owner(att_id, conversation)
    att = await store(request).get(att_id)
    media = att.mime if att.kind == "image" else "text/plain; charset=utf-8"
    return Response(
        att.data,
        media_type=media,
        headers={"Cache-Control": "private, max-age=3600", "X-Content-Type-Options": "nosniff"},
    )


async def expand(
    request: Request, bus: Bus, content: str, ids: list[str], conversation: str | None = None
) -> tuple[str, list[ImageAttachment]]:
    """A send's text with its text attachments inlined (one fenced block per file, headed by
    its name, after the message), and its images as data URLs. Each attachment is claimed
    for ``conversation`` (None: the one the send makes, bound by the caller afterwards).

    Raises:
        BadRequest: too many attachments; VisionUnavailable: an image while the engine (or
            the external preset) has no vision; TooLarge: the images together exceed what one
            bus message carries; AttachmentGone (also: it belongs to another conversation),
            MemoryLockedError: see the store.
    """
    if len(ids) > MAX_PER_MESSAGE:
        raise BadRequest(
            f"{len(ids)} attachments: at most {MAX_PER_MESSAGE} per message",
            code="too_many_attachments",
        )
    for att_id in dict.fromkeys(ids):
        await store(request).claim(att_id, conversation)
    atts = [await store(request).get(i) for i in dict.fromkeys(ids)]
    blocks = [fenced(a.name, a.text()) for a in atts if a.kind == "text"]
    images = [
        ImageAttachment(id=a.id, name=a.name, url=a.data_url()) for a in atts if a.kind == "image"
    ]
    if images:
        info = await bus.request_ok(subjects.ENGINE_INFO, EngineInfoRequest(), EngineInfo)
        if not info.vision:
            names = ", ".join(i.name for i in images)
            raise VisionUnavailable(
                f"the model in use cannot see images ({names} not sent): the engine has no "
                "vision projector (preset MMPROJ) or the external preset is not marked "
                "EXTERNAL_VISION; remove the image or switch preset"
            )
        total = sum(len(i.url) for i in images)
        if total > MAX_PAYLOAD - 2 * 1024 * 1024:
            raise TooLarge(
                f"the images of this message are {total // (1024 * 1024)} MB encoded together: "
                "send fewer at once"
            )
    text = "\n\n".join([content, *blocks]) if content else "\n\n".join(blocks)
    return text, images


def as_meta(images: list[ImageAttachment]) -> list[dict[str, Any]]:
    """The images' public fields (id, name): what the display log keeps of them."""
    return [{"id": i.id, "name": i.name} for i in images]
