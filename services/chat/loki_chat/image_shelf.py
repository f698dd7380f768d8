"""The images a conversation was given, kept so ``see_image`` can show one again.

Rules:

- One Redis hash per conversation, ``loki:chat:img:<id>``: field = the attachment id, value =
  the image (``{"id", "name", "url"}``, its data URL) sealed with the service sealer
  (associated data = ``<hash key>:<attachment id>``), like the conversation blob itself.
- The hash expires :data:`TTL_S` (24 h) after its last use: every store and every lookup
  sets the expiry again. Deleting the conversation deletes it.
- A lookup (:meth:`ImageShelf.find`) matches the attachment id, the file name, or the last
  path component of what the model wrote (``/tmp/cat.png`` finds ``cat.png``); the newest
  image of that name wins. Nothing matching is None (the tool then says what to resend).
"""

from __future__ import annotations

import json
import posixpath

import redis.asyncio as aioredis

from loki_shared.messages.chat import ImageAttachment
from loki_shared.sealing import Sealer, SealError

#: Seconds the images of a conversation live after their last use (24 h).
TTL_S = 24 * 3600


def shelf_key(cid: str) -> str:
    """The Redis hash of conversation ``cid``'s images."""
    return f"loki:chat:img:{cid}"


class ImageShelf:
    """Sealed images per conversation (see the module rules).

    Args:
        client: a ``redis.asyncio.Redis`` (bytes responses).
        sealer: the service sealer.
    """

    def __init__(self, client: aioredis.Redis, sealer: Sealer) -> None:
        self.r = client
        self.sealer = sealer

    async def put(self, cid: str, images: list[ImageAttachment]) -> None:
        """Keep ``images`` (arrival order) under conversation ``cid``; refreshes the expiry."""
        if not images:
            return
        key = shelf_key(cid)
        order = await self.r.hlen(key)
        mapping: dict[str, bytes] = {}
        for n, image in enumerate(images):
            record = {**image.model_dump(), "order": order + n}
            mapping[image.id] = self.sealer.seal(
                json.dumps(record).encode(), f"{key}:{image.id}".encode()
            )
        await self.r.hset(key, mapping=mapping)
        await self.r.expire(key, TTL_S)

    async def all(self, cid: str) -> list[ImageAttachment]:
        """Every image of ``cid``, oldest first (an unreadable entry is skipped)."""
        key = shelf_key(cid)
        raw = await self.r.hgetall(key)
        records: list[tuple[int, ImageAttachment]] = []
        for field, blob in raw.items():
            att_id = field.decode() if isinstance(field, bytes) else str(field)
            try:
                data = json.loads(self.sealer.open(blob, f"{key}:{att_id}".encode()))
            except (SealError, ValueError):  # a damaged entry is no image
                continue
            order = int(data.pop("order", 0))
            records.append((order, ImageAttachment.model_validate(data)))
        if records:
            await self.r.expire(key, TTL_S)
        return [image for _, image in sorted(records, key=lambda r: r[0])]

    async def find(self, cid: str, path: str) -> ImageAttachment | None:
        """The image ``path`` names (id, file name, or a path ending in the file name); the
        newest of that name; None when none matches."""
        wanted = path.strip()
        if not wanted:
            return None
        base = posixpath.basename(wanted.replace("\\", "/"))
        images = await self.all(cid)
        for image in reversed(images):
            if wanted in (image.id, image.name) or base == image.name:
                return image
        return None

    async def names(self, cid: str) -> list[str]:
        """The file names of ``cid``'s images, oldest first, without repeats."""
        return list(dict.fromkeys(i.name for i in await self.all(cid)))

    async def drop(self, cid: str) -> None:
        """Forget every image of ``cid`` (the conversation was deleted)."""
        await self.r.delete(shelf_key(cid))
