"""Media URLs in ``/v1`` bodies: Loki decides, the engine never fetches.

llama-server downloads any content part URL that starts with ``http`` (``image_url.url``,
``input_audio``, ``input_video``/``video_url``, the Responses API's ``input_image``; llama.cpp
``handle_media``: 10 MB, 10 s, no address check), so a client that can reach ``/v1`` could
make the engine request any address it can reach (server-side request forgery: unsloth
#11010, llama.cpp PR #25002). The rule, applied to every media part of ``messages`` (chat
completions) and ``input`` (Responses) before the engine sees the body:

- a ``data:`` URL, or bare base64 (OpenAI's ``input_audio.data``), passes unchanged;
- any other URL (``http``, ``https``, ``file``, any scheme) is refused with 400
  ``remote_media_refused`` naming the field (``messages[0].content[1].image_url.url``),
  unless Loki fetches images itself
  (``LOKI_IMAGE_FETCH_HOSTS`` set, off by default). Then an ``http``/``https`` image URL is
  fetched by :func:`fetch_image` and replaced by a ``data:`` URL of the bytes; audio and
  video URLs stay refused;
- :func:`fetch_image`: the host must be on the allow-list (``LOKI_IMAGE_FETCH_HOSTS``:
  names, ``*.example.org`` for a domain's hosts, ``*`` for any) and EVERY address it resolves
  to must be global (no loopback, private, link-local, reserved, multicast or shared
  addresses) unless inside ``LOKI_IMAGE_FETCH_NETWORKS`` (CIDRs); the connection goes to the
  address checked (no second resolution: DNS rebinding), TLS still verified for the name;
  redirects are followed by hand, at most :data:`MAX_REDIRECTS`, each new URL checked the
  same way; the body is read up to ``LOKI_UPLOAD_MAX_MB`` (larger: 413) within
  ``LOKI_IMAGE_FETCH_TIMEOUT_S`` in all; the bytes must be an image Loki accepts (by content,
  :data:`loki_gateway.attachments.IMAGE_TYPES`), else 400.

Chat attachments and ``see_image`` follow the same rule by construction: their images are
``data:`` URLs Loki built from uploaded bytes, and the chat service refuses any other URL
(:class:`loki_shared.messages.chat.ImageAttachment`).
"""

from __future__ import annotations

import asyncio
import base64
import fnmatch
import ipaddress
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import filetype  # type: ignore[import-untyped]
import httpx

from .attachments import IMAGE_TYPES
from .errors import BadRequest

#: Content part types llama-server loads media for, and where their URL lies.
MEDIA_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "image_url": (("image_url", "url"),),
    "input_image": (("image_url",),),
    "input_audio": (("input_audio", "data"), ("input_audio", "url")),
    "input_video": (("input_video", "data"), ("input_video", "url")),
    "video_url": (("video_url", "data"), ("video_url", "url")),
}
IMAGE_PARTS = frozenset({"image_url", "input_image"})
MAX_REDIRECTS = 3


class RemoteMediaRefused(BadRequest):
    """400: a media URL Loki does not fetch (remote fetching off, not an image, not
    allowed)."""

    code = "remote_media_refused"


class MediaTooLarge(BadRequest):
    """413: a fetched image is over the upload limit."""

    http_status = 413
    code = "file_too_large"


@dataclass(frozen=True)
class FetchPolicy:
    """What :func:`fetch_image` may fetch. ``hosts`` empty: fetching off.

    Attributes:
        hosts: host name patterns (``fnmatch``, lower case): ``*`` any host.
        networks: networks whose addresses may be fetched though not global.
        max_bytes: largest body read.
        timeout_s: the whole fetch, redirects included.
    """

    hosts: tuple[str, ...] = ()
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    max_bytes: int = 8 * 1024 * 1024
    timeout_s: float = 10.0

    @property
    def enabled(self) -> bool:
        return bool(self.hosts)

    def host_allowed(self, host: str) -> bool:
        """Whether ``host`` (lower case, no port) matches the allow-list."""
        return any(fnmatch.fnmatchcase(host, pattern) for pattern in self.hosts)

    def address_allowed(self, address: str) -> bool:
        """Whether ``address`` may be connected to: global, or inside ``networks``."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in self.networks):
            return True
        return ip.is_global and not ip.is_multicast


def media_urls(value: Any, path: str) -> list[tuple[str, dict[str, Any], str, str]]:
    """Every media URL in ``value`` (``messages`` or ``input``, any depth): ``(param path,
    the object holding it, its key, the part's type)``."""
    found: list[tuple[str, dict[str, Any], str, str]] = []
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, list):
            stack.extend((f"{where}[{i}]", child) for i, child in enumerate(item))
            continue
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        for route in MEDIA_FIELDS.get(kind, ()) if isinstance(kind, str) else ():
            holder: Any = item
            for key in route[:-1]:
                holder = holder.get(key) if isinstance(holder, dict) else None
            if isinstance(holder, dict) and isinstance(holder.get(route[-1]), str):
                found.append((f"{where}.{'.'.join(route)}", holder, route[-1], str(kind)))
        stack.extend((f"{where}.{k}", child) for k, child in item.items() if k != "type")
    return found


def _is_inline(url: str) -> bool:
    """A ``data:`` URL, or bare base64 (OpenAI's ``input_audio.data``: no scheme at all)."""
    return url[:5].lower() == "data:" or ":" not in url


async def check_media(
    body: dict[str, Any], root: str, policy: FetchPolicy, client: httpx.AsyncClient
) -> None:
    """Apply the module's rule to ``body[root]`` in place (remote images fetched and
    replaced by ``data:`` URLs when the policy allows).

    Raises:
        RemoteMediaRefused: a URL that is not ``data:`` and may not be fetched.
        MediaTooLarge: a fetched image over ``policy.max_bytes``.
    """
    for param, holder, key, kind in media_urls(body.get(root), root):
        url = holder[key]
        if _is_inline(url):
            continue
        scheme = urlsplit(url).scheme.lower()
        if not policy.enabled or kind not in IMAGE_PARTS or scheme not in ("http", "https"):
            raise RemoteMediaRefused(
                f"{param}: Loki does not fetch remote media"
                + (" (remote image fetching is off)" if not policy.enabled else "")
                + ": send the content as a data: URL (data:<mime>;base64,...)",
                param=param,
            )
        holder[key] = await fetch_image(url, policy, client, param)


async def _resolve(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def _pinned_request(
    url: str, policy: FetchPolicy, client: httpx.AsyncClient, param: str
) -> httpx.Request:
    """A GET of ``url`` sent to the address checked for its host (see the module)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme.lower() not in ("http", "https") or not host:
        raise RemoteMediaRefused(f"{param}: {url[:200]!r} is not an http(s) URL", param=param)
    if parts.username or parts.password:
        raise RemoteMediaRefused(f"{param}: a URL with credentials is not fetched", param=param)
    if not policy.host_allowed(host):
        raise RemoteMediaRefused(
            f"{param}: the host {host!r} is not in LOKI_IMAGE_FETCH_HOSTS", param=param
        )
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    try:
        addresses = await _resolve(host, port)
    except OSError as exc:
        raise RemoteMediaRefused(f"{param}: {host!r} does not resolve", param=param) from exc
    refused = [a for a in addresses if not policy.address_allowed(a)]
    if not addresses or refused:
        raise RemoteMediaRefused(
            f"{param}: {host!r} resolves to an address Loki does not fetch from "
            f"({', '.join(refused) or 'none'}: loopback, private, link-local and reserved "
            "addresses need LOKI_IMAGE_FETCH_NETWORKS)",
            param=param,
        )
    pinned = httpx.URL(url).copy_with(host=addresses[0], port=port)
    headers = {"Host": parts.netloc.rsplit("@", 1)[-1], "Accept": "image/*"}
    return client.build_request("GET", pinned, headers=headers, extensions={"sni_hostname": host})


async def fetch_image(url: str, policy: FetchPolicy, client: httpx.AsyncClient, param: str) -> str:
    """Fetch a remote image under ``policy`` (module docstring) and return it as a
    ``data:<mime>;base64,...`` URL.

    Raises:
        RemoteMediaRefused: not allowed, failed, too slow, or not an image.
        MediaTooLarge: over ``policy.max_bytes``.
    """
    try:
        async with asyncio.timeout(policy.timeout_s):
            for _ in range(MAX_REDIRECTS + 1):
                req = await _pinned_request(url, policy, client, param)
                resp = await client.send(req, stream=True, follow_redirects=False)
                try:
                    if resp.is_redirect and "location" in resp.headers:
                        url = urljoin(url, resp.headers["location"])
                        continue
                    if resp.status_code != 200:
                        raise RemoteMediaRefused(
                            f"{param}: the image URL answered {resp.status_code}", param=param
                        )
                    data = bytearray()
                    async for piece in resp.aiter_bytes():
                        data += piece
                        if len(data) > policy.max_bytes:
                            raise MediaTooLarge(
                                f"{param}: the image is over {policy.max_bytes} bytes",
                                param=param,
                            )
                finally:
                    await resp.aclose()
                break
            else:
                raise RemoteMediaRefused(
                    f"{param}: more than {MAX_REDIRECTS} redirects", param=param
                )
    except TimeoutError as exc:
        raise RemoteMediaRefused(
            f"{param}: the image was not fetched within {policy.timeout_s} s", param=param
        ) from exc
    except httpx.HTTPError as exc:
        raise RemoteMediaRefused(
            f"{param}: the image could not be fetched ({type(exc).__name__})", param=param
        ) from exc
    guess = filetype.guess(bytes(data[:8192]))
    mime = guess.mime if guess is not None else None
    if mime not in IMAGE_TYPES:
        raise RemoteMediaRefused(
            f"{param}: the URL's content is not an image Loki accepts (PNG, JPEG, GIF, WebP)",
            param=param,
        )
    return f"data:{mime};base64,{base64.b64encode(bytes(data)).decode('ascii')}"
