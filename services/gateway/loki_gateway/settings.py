"""The gateway's settings, read from ``LOKI_*`` environment variables in ``__main__``."""

from __future__ import annotations

import ipaddress

from pydantic import Field, SecretStr

from loki_shared.settings import LokiSettings

from .media_urls import FetchPolicy

LOOPBACK = "127.0.0.1"


class Settings(LokiSettings):
    """Gateway configuration.

    - ``LOKI_WEB_PORT`` (8090): the one public HTTP port.
    - ``LOKI_WEB_HOST``: the listen address. Unset: ``0.0.0.0`` when ``LOKI_API_KEY`` is set,
      loopback (``127.0.0.1``) when it is not, so an unprotected Loki is never reachable from
      another machine unless told so explicitly.
    - ``LOKI_API_KEY``: when set, every ``/api`` and ``/v1`` route needs
      ``Authorization: Bearer <key>``.
    - ``LOKI_MAX_BODY_BYTES`` (16 MiB): request bodies above it get 413.
    - ``LOKI_UPLOAD_MAX_MB`` (8): largest file ``/api/chat/upload`` accepts (413 over it).
    - ``LOKI_MAX_MESSAGE_CHARS`` (1 000 000): longest user message ``/api/chat/send`` accepts.
    - ``LOKI_SSE_PING_S`` (4): seconds between ``: ping`` comments on ``/api/chat``.
    - ``LOKI_SSE_CLIENT_BUFFER`` (4096): live events one SSE client may have waiting; past it
      the client is told to reconnect (and resumes by replay).
    - ``LOKI_SSE_REPLAY_PAGE`` (200): events asked per ``loki.chat.replay`` request.
    - ``LOKI_SSE_COALESCE_MIN`` (256): a replay of more events than this is coalesced
      (consecutive text deltas merged); a shorter one is sent event by event.
    - ``LOKI_LEASE_WAIT_S`` (60): how long a ``/v1`` request may wait for an engine lease.
    - ``LOKI_UPSTREAM_TIMEOUT_S`` (600): read timeout towards the engine.
    - ``LOKI_IMAGE_FETCH_HOSTS``: host names (comma-separated; ``*.example.org``, ``*`` for
      any) whose ``http(s)`` image URLs in ``/v1`` bodies Loki fetches itself and sends the
      engine as data URLs; unset (the default): every remote media URL is refused with 400
      (see loki_gateway.media_urls).
    - ``LOKI_IMAGE_FETCH_NETWORKS``: networks (CIDRs, comma-separated) whose addresses may be
      fetched though not global (loopback, private, link-local are refused otherwise).
    - ``LOKI_IMAGE_FETCH_TIMEOUT_S`` (10): the whole fetch of one image, redirects included
      (its size limit is the upload limit).
    - ``LOKI_CORS_ORIGINS``: origins (comma-separated, ``*`` for any) whose web pages may
      call Loki (``/v1``, ``/api``) from a browser; unset: no CORS answer at all.
    """

    web_port: int = Field(default=8090, ge=1, le=65535)
    web_host: str | None = None
    api_key: SecretStr | None = None
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    max_message_chars: int = Field(default=1_000_000, ge=1)
    upload_max_mb: float = Field(default=8.0, gt=0, le=16)
    sse_ping_s: float = Field(default=4.0, gt=0)
    sse_client_buffer: int = Field(default=4096, ge=16)
    sse_replay_page: int = Field(default=200, ge=1)
    sse_coalesce_min: int = Field(default=256, ge=0)
    lease_wait_s: float = Field(default=60.0, gt=0)
    upstream_timeout_s: float = Field(default=600.0, gt=0)
    cors_origins: str = ""
    image_fetch_hosts: str = ""
    image_fetch_networks: str = ""
    image_fetch_timeout_s: float = Field(default=10.0, gt=0, le=120)

    def image_policy(self) -> FetchPolicy:
        """The remote image policy (``LOKI_IMAGE_FETCH_*``, :mod:`loki_gateway.media_urls`).

        Raises:
            ValueError: a network that is not a CIDR (at start-up).
        """
        hosts = tuple(h.strip().lower() for h in self.image_fetch_hosts.split(",") if h.strip())
        networks = tuple(
            ipaddress.ip_network(n.strip(), strict=False)
            for n in self.image_fetch_networks.split(",")
            if n.strip()
        )
        return FetchPolicy(
            hosts=hosts,
            networks=networks,
            max_bytes=int(self.upload_max_mb * 1024 * 1024),
            timeout_s=self.image_fetch_timeout_s,
        )

    def listen_host(self) -> str:
        """The address uvicorn binds: ``LOKI_WEB_HOST``, else loopback without a key."""
        if self.web_host:
            return self.web_host
        return "0.0.0.0" if self.key() else LOOPBACK

    def cors(self) -> list[str]:
        """``LOKI_CORS_ORIGINS`` as a list (empty: CORS off); an origin's trailing ``/`` is
        dropped (browsers send ``Origin`` without it)."""
        return [o.strip().rstrip("/") for o in self.cors_origins.split(",") if o.strip()]

    def key(self) -> str | None:
        """The API key as text, or None when unset or empty."""
        if self.api_key is None:
            return None
        value = self.api_key.get_secret_value()
        return value or None
