"""Attachments: files a person gives Loki with a message (``POST /api/chat/upload``).

Rules:

- **Type by content, never by name.** :func:`classify` sniffs the bytes (the ``filetype``
  library's magic numbers): PNG, JPEG, GIF and WebP are images; a PDF is read with ``pypdf``
  and kept as its extracted text; anything else is text if it is UTF-8 without NUL bytes, or
  UTF-16/UTF-32 with a byte order mark (kept as UTF-8). Everything else is refused
  (:class:`UnsupportedType`, 415).
- **Every parser's failure is the file's.** An image is decoded whole (Pillow) before it is
  kept, so a broken or truncated one never reaches the engine; a PDF ``pypdf`` cannot read (a
  filter it does not decode, ``/JBIG2Decode`` without its helper, a broken stream: any
  exception of the parser), text that does not decode in the encoding its byte order mark
  names, or an image Pillow cannot decode is :class:`Unreadable` (422); every refusal names the
  file, and nothing is stored.
- **Size.** Over ``LOKI_UPLOAD_MAX_MB`` is refused (:class:`TooLarge`, 413).
- **Stored sealed.** One Redis key per attachment, ``loki:chat:att:<id>``, sealed with the
  service key (associated data = the key name); when the memory is encrypted (a KDF record
  exists) the record is sealed with the memory key first (associated data = the key name +
  ``:memory``), and storing or reading it while the memory is locked is refused
  (:class:`~loki_shared.errors.Locked`, 423).
- **Pruned 24 h after the last use**: the key expires :data:`TTL_S` after it was stored, and
  every read (a send, a thumbnail) sets that expiry again.
- An id is 32 hex characters (random); a missing or expired one is :class:`AttachmentGone`
  (404), saying to upload again.
- **One conversation's.** The first send that carries an attachment binds it to that
  conversation (``loki:chat:att:<id>:conv``, ``SET NX``, the same 24 h expiry); a send in
  another conversation, or a read that names another, gets :class:`AttachmentGone` (404) as
  if it did not exist (:meth:`AttachmentStore.claim`). An image the model saw stays on its
  conversation's own shelf (``loki:chat:img:<conversation>``), which only that conversation
  reads.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import secrets
import time
from dataclasses import dataclass
from typing import Literal

import filetype  # type: ignore[import-untyped]
from PIL import Image
from pypdf import PdfReader
from redis.asyncio import Redis

from loki_shared import memkey
from loki_shared.errors import InvalidRequest, Locked, NotFound
from loki_shared.sealing import Sealer

Kind = Literal["image", "text"]

#: Seconds an attachment lives after its last use (24 h).
TTL_S = 24 * 3600
#: Image types the engine accepts (llama.cpp's mtmd decodes these with stb_image).
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
ID_PATTERN = r"^[0-9a-f]{32}$"
_KEY_PREFIX = "loki:chat:att:"
_PLAIN = b"P"
_MEMORY = b"M"


class TooLarge(InvalidRequest):
    """413 ``invalid_request_error``: the file is over ``LOKI_UPLOAD_MAX_MB``."""

    http_status = 413
    code = "file_too_large"


class UnsupportedType(InvalidRequest):
    """415 ``invalid_request_error``: the file's content is neither an image Loki accepts,
    a PDF, nor UTF-8 text."""

    http_status = 415
    code = "unsupported_file_type"


class Unreadable(InvalidRequest):
    """422 ``invalid_request_error``: the file is of a type Loki accepts, but its parser
    (``pypdf``, Pillow, the text decoder) cannot read it."""

    http_status = 422
    code = "unreadable_file"


#: The most pixels an image may have (decoding it whole must stay cheap; an engine would not
#: take more anyway).
MAX_PIXELS = 64_000_000
#: Byte order marks of the text encodings accepted besides UTF-8 (longest first).
_BOMS = (
    (b"\xff\xfe\x00\x00", "utf-32"),
    (b"\x00\x00\xfe\xff", "utf-32"),
    (b"\xef\xbb\xbf", "utf-8-sig"),
    (b"\xff\xfe", "utf-16"),
    (b"\xfe\xff", "utf-16"),
)


class AttachmentGone(NotFound):
    """404 ``not_found_error``: no attachment with that id (never stored, or pruned 24 h
    after its last use)."""

    openai_type = "not_found_error"
    code = "attachment_not_found"


class MemoryLockedError(Locked):
    """423: the memory is encrypted and locked, so an attachment can be neither sealed nor
    opened."""

    code = "memory_locked"


@dataclass(frozen=True)
class Attachment:
    """One stored attachment.

    ``kind``: ``image`` (``data`` is the file's bytes, ``mime`` its sniffed type) or ``text``
    (``data`` is UTF-8 text: the file itself, or the text extracted from a PDF; ``mime`` is
    ``text/plain`` or ``application/pdf``). ``name``: the file name the user gave (display
    only). ``size``: the uploaded file's size in bytes. ``created``: Unix time, seconds.
    """

    id: str
    name: str
    kind: Kind
    mime: str
    size: int
    data: bytes
    created: float

    def data_url(self) -> str:
        """``data:<mime>;base64,...`` of the bytes (the OpenAI ``image_url`` form)."""
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"

    def text(self) -> str:
        """The text of a ``text`` attachment."""
        return self.data.decode("utf-8")

    def meta(self) -> dict[str, object]:
        """What the API shows of it (no content): id, name, kind, mime, size."""
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "mime": self.mime,
            "size": self.size,
        }


def clean_name(name: str | None) -> str:
    """A display name: the last path component, control characters removed, at most 200
    characters; ``file`` when nothing is left."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(ch for ch in base if ch.isprintable()).strip()
    return base[:200] or "file"


def classify(raw: bytes, name: str = "file") -> tuple[Kind, str, bytes]:
    """The kind, MIME type and stored bytes of an uploaded file, by its content.

    Returns:
        ``("image", mime, raw)`` for PNG/JPEG/GIF/WebP that decode whole; ``("text",
        "application/pdf", text)`` for a PDF (its pages' text, UTF-8); ``("text",
        "text/plain", utf8)`` for UTF-8 text without NUL bytes, or UTF-16/32 text with a byte
        order mark (re-encoded as UTF-8).

    Raises:
        UnsupportedType: any other content (the detected type is named when known), a PDF
            that is encrypted or holds no text. Unreadable: an accepted type its parser
            cannot read. Both name the file (``name``).
    """
    guess = filetype.guess(raw)
    mime = guess.mime if guess is not None else None
    if mime in IMAGE_TYPES:
        check_image(raw, str(mime), name)
        return "image", str(mime), raw
    if mime == "application/pdf":
        return "text", "application/pdf", pdf_text(raw, name).encode("utf-8")
    if mime is None:
        text = decode_text(raw, name)
        if text is not None:
            return "text", "text/plain", text.encode("utf-8")
    found = f"its content is {mime}" if mime else "its content is binary, not UTF-8 text"
    raise UnsupportedType(
        f"{name!r}: this file type is not accepted ({found}): send an image (PNG, JPEG, GIF, "
        "WebP), a PDF or a UTF-8 text file"
    )


def decode_text(raw: bytes, name: str = "file") -> str | None:
    """The text of ``raw``: UTF-8 (no NUL byte), or the encoding its byte order mark names
    (UTF-8, UTF-16, UTF-32); None when it is neither (not text Loki reads).

    Raises:
        Unreadable: a byte order mark whose encoding the rest does not decode in.
    """
    for bom, codec in _BOMS:
        if raw.startswith(bom):
            try:
                text = raw.decode(codec)
            except UnicodeDecodeError as exc:
                raise Unreadable(
                    f"{name!r} starts as {codec.removesuffix('-sig').upper()} text but does not "
                    f"decode as it ({exc.reason} at byte {exc.start}): send it saved as UTF-8"
                ) from exc
            return None if "\x00" in text else text
    if b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def check_image(raw: bytes, mime: str, name: str = "file") -> None:
    """Decode the image whole (Pillow), as the engine will have to.

    Raises:
        Unreadable: Pillow cannot open or decode it (broken, truncated), or it has more than
            :data:`MAX_PIXELS` pixels.
    """
    try:
        with Image.open(io.BytesIO(raw)) as img:
            width, height = img.size
            if width * height > MAX_PIXELS:
                raise Unreadable(
                    f"{name!r} is {width}×{height} pixels: send an image of at most "
                    f"{MAX_PIXELS // 1_000_000} million pixels"
                )
            img.load()
    except Unreadable:
        raise
    except Exception as exc:  # Pillow fails on a broken image in many ways: each is Unreadable
        raise Unreadable(
            f"{name!r} looks like {mime} but cannot be decoded ({type(exc).__name__}: {exc}): "
            "send it again, or saved afresh"
        ) from exc


def pdf_text(raw: bytes, name: str = "file") -> str:
    """The text of every page of a PDF (pages separated by a blank line).

    Raises:
        UnsupportedType: the PDF is encrypted, or has no extractable text (a scan: send its
            pages as images instead).
        Unreadable: ``pypdf`` fails on it in any way (a filter it cannot decode, such as
            ``/JBIG2Decode`` or an unknown one; a broken file).
    """
    try:
        reader = PdfReader(io.BytesIO(raw))
        if reader.is_encrypted:
            raise UnsupportedType(f"{name!r}: this PDF is encrypted: send it decrypted, or as text")
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
    except UnsupportedType:
        raise
    except Exception as exc:  # pypdf fails on a broken PDF in many ways: each is Unreadable
        raise Unreadable(
            f"{name!r}: this PDF cannot be read ({type(exc).__name__}: {exc}): send its text, "
            "or its pages as images"
        ) from exc
    # a lone surrogate pypdf may leave (a broken ToUnicode map) would not encode as UTF-8
    text = "\n\n".join(p for p in pages if p).encode("utf-8", "replace").decode("utf-8")
    if not text:
        raise UnsupportedType(
            f"{name!r}: this PDF has no text to extract (a scan?): send its pages as images instead"
        )
    return text


def redis_key(att_id: str) -> str:
    """The Redis key of attachment ``att_id``."""
    return _KEY_PREFIX + att_id


def owner_key(att_id: str) -> str:
    """The Redis key naming the conversation attachment ``att_id`` belongs to."""
    return _KEY_PREFIX + att_id + ":conv"


def _elsewhere(att_id: str) -> AttachmentGone:
    return AttachmentGone(
        f"attachment {att_id[:40]!r} does not exist in this conversation (an attachment "
        "belongs to the conversation it was first sent in): upload the file again here"
    )


class AttachmentStore:
    """Attachments in Redis, sealed (see the module rules).

    Args:
        redis: asyncio Redis client.
        sealer: the service key's sealer.
        memory_key: a callable giving the memory key while it is held (None otherwise).
    """

    def __init__(self, redis: Redis, sealer: Sealer, memory_key: object) -> None:
        self.redis = redis
        self.sealer = sealer
        self._memory_key = memory_key

    async def _memory(self) -> Sealer | None:
        """The memory key's sealer when the memory is encrypted; None when it is not.

        Raises:
            MemoryLockedError: the memory is encrypted and its key is not held.
        """
        key = self._memory_key() if callable(self._memory_key) else None
        if key is not None:
            return Sealer(key)
        if await self.redis.exists(memkey.KDF_REDIS_KEY):
            raise MemoryLockedError(
                "the memory is encrypted and locked: unlock it to use attachments"
            )
        return None

    async def put(self, name: str, raw: bytes) -> Attachment:
        """Classify ``raw`` (:func:`classify`), seal and store it; return it with its new id.

        Raises:
            UnsupportedType, Unreadable (nothing stored), MemoryLockedError.
        """
        kind, mime, data = classify(raw, clean_name(name))
        memory = await self._memory()
        att = Attachment(
            id=secrets.token_hex(16),
            name=clean_name(name),
            kind=kind,
            mime=mime,
            size=len(raw),
            data=data,
            created=time.time(),
        )
        record = json.dumps(
            {
                "name": att.name,
                "kind": att.kind,
                "mime": att.mime,
                "size": att.size,
                "created": att.created,
                "data": base64.b64encode(att.data).decode("ascii"),
            }
        ).encode("utf-8")
        key = redis_key(att.id)
        if memory is not None:
            inner = _MEMORY + memory.seal(record, f"{key}:memory".encode())
        else:
            inner = _PLAIN + record
        await self.redis.set(key, self.sealer.seal(inner, key.encode()), ex=TTL_S)
        return att

    async def claim(self, att_id: str, conversation: str | None) -> None:
        """Bind ``att_id`` to ``conversation`` on its first use; its expiry starts again.
        ``conversation`` None (a send that makes a new conversation) only checks that the
        attachment belongs to none yet (:meth:`bind` binds it once the id is known).

        Raises:
            AttachmentGone: it belongs to another conversation.
        """
        key = owner_key(att_id)
        if conversation is not None and await self.redis.set(key, conversation, nx=True, ex=TTL_S):
            return
        owner = await self.redis.get(key)
        if owner is None and conversation is None:
            return
        if owner is None or owner.decode() != conversation:
            raise _elsewhere(att_id)
        await self.redis.expire(key, TTL_S)

    async def bind(self, att_ids: list[str], conversation: str) -> None:
        """Bind each of ``att_ids`` not yet bound to ``conversation`` (after a send made it)."""
        for att_id in att_ids:
            await self.redis.set(owner_key(att_id), conversation, nx=True, ex=TTL_S)

    async def check_owner(self, att_id: str, conversation: str) -> None:
        """Refuse a read of ``att_id`` that names another ``conversation`` than its own (one
        not bound yet is anyone's: it sits in the composer's tray).

        Raises:
            AttachmentGone: it belongs to another conversation.
        """
        owner = await self.redis.get(owner_key(att_id))
        if owner is not None and owner.decode() != conversation:
            raise _elsewhere(att_id)

    async def get(self, att_id: str) -> Attachment:
        """The attachment ``att_id``; its 24 h expiry starts again.

        Raises:
            AttachmentGone: no such id (or pruned).
            MemoryLockedError: sealed with the memory key, which is not held.
        """
        key = redis_key(att_id)
        blob = await self.redis.get(key) if len(att_id) == 32 else None
        if blob is None:
            raise AttachmentGone(
                f"attachment {att_id[:40]!r} does not exist (attachments are pruned 24 h "
                "after their last use): upload the file again"
            )
        await self.redis.expire(key, TTL_S)
        inner = self.sealer.open(blob, key.encode())
        if inner[:1] == _MEMORY:
            key_bytes = self._memory_key() if callable(self._memory_key) else None
            if key_bytes is None:
                raise MemoryLockedError(
                    "this attachment is sealed with the memory key: unlock the memory first"
                )
            record = Sealer(key_bytes).open(inner[1:], f"{key}:memory".encode())
        else:
            record = inner[1:]
        data = json.loads(record)
        try:
            content = base64.b64decode(data["data"], validate=True)
        except binascii.Error as exc:  # sealed, so only a bug gets here
            raise AttachmentGone(f"attachment {att_id} is unreadable") from exc
        return Attachment(
            id=att_id,
            name=str(data["name"]),
            kind=data["kind"],
            mime=str(data["mime"]),
            size=int(data["size"]),
            data=content,
            created=float(data["created"]),
        )


def fenced(name: str, text: str) -> str:
    """A text file as one fenced block headed by its name, the fence longer than any run of
    backticks in the text (so the block cannot be closed early)."""
    longest = 0
    run = 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return f"Attached file `{name}`:\n{fence}\n{text}\n{fence}"
