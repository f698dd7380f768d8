"""The one way a Loki process opens its Redis client: a plain server, or a Sentinel-watched one.

``LOKI_REDIS_URL`` takes every form ``redis.asyncio.Redis.from_url`` reads, unchanged
(``redis://``, ``rediss://``, ``unix://``), and one more for Redis Sentinel (issue 44)::

    redis+sentinel://[user:password@]host1:26379,host2:26379,host3:26379/<service>/<db>
        [?sentinel_username=NAME&sentinel_password=SECRET&socket_timeout=SECONDS]

- the hosts are the **sentinels** (port 26379 when left out), not Redis itself: the client
  asks them which server is the master of ``<service>`` (the name of ``sentinel monitor``,
  e.g. ``loki``) and asks again after a failover, so a promoted replica is found by itself;
- ``<db>``: the database number (default 0);
- ``user:password@`` (or ``LOKI_REDIS_USER`` / ``LOKI_REDIS_PASSWORD``, which win, as for a
  plain URL) logs in to the **master** — the service's own ACL user;
- ``sentinel_username`` / ``sentinel_password``: the sentinels' own login, when they require
  one (``requirepass`` / ``user`` in sentinel.conf); none by default;
- ``socket_timeout``: seconds a command may wait (default none, as redis-py's) — the sentinels
  are always asked with a 1 s timeout.

Use :func:`redis_client` in a service (its settings' URL and login), :func:`redis_from_url`
where only a URL is at hand (the backup tool). Tools that need one ``host:port`` (a
``redis-cli`` health check) cannot follow a sentinel URL: :func:`single_address` says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from redis.asyncio import Redis

if TYPE_CHECKING:  # pragma: no cover
    from .settings import LokiSettings

SENTINEL_SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379
#: Seconds each sentinel gets to answer "who is the master".
SENTINEL_TIMEOUT_S = 1.0


class RedisUrlError(ValueError):
    """``LOKI_REDIS_URL`` cannot be read; the message says which part and the form to resend."""


@dataclass(frozen=True)
class SentinelUrl:
    """A parsed ``redis+sentinel://`` URL (see the module docstring)."""

    sentinels: list[tuple[str, int]]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_options: dict[str, Any] = field(default_factory=dict)
    socket_timeout: float | None = None


_FORM = "redis+sentinel://[user:password@]host1:26379,host2:26379/<service>/<db>"


def is_sentinel_url(url: str) -> bool:
    """Whether ``url`` names Redis through Sentinel (``redis+sentinel://``)."""
    return url.strip().lower().startswith(SENTINEL_SCHEME + "://")


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Read a ``redis+sentinel://`` URL.

    Raises:
        RedisUrlError: not that scheme, no sentinel host, a port or db that is not a number,
            no service name, or an unknown query parameter (the message gives the form).
    """
    parts = urlsplit(url.strip())
    if parts.scheme.lower() != SENTINEL_SCHEME:
        raise RedisUrlError(f"not a {SENTINEL_SCHEME}:// URL; the form is {_FORM}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, sep, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if sep else None
    sentinels: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, sep, port = item.strip().rpartition(":") if ":" in item else (item, "", "")
        host = host.strip().strip("[]")
        if not host:
            raise RedisUrlError(f"a sentinel host is empty in {hosts!r}; the form is {_FORM}")
        try:
            sentinels.append((host, int(port) if sep else DEFAULT_SENTINEL_PORT))
        except ValueError:
            raise RedisUrlError(
                f"sentinel port {port!r} is not a number; the form is {_FORM}"
            ) from None
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise RedisUrlError(
            f"the path must be /<service>/<db>, got {parts.path!r}; the form is {_FORM}"
        )
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise RedisUrlError(f"database {path[1]!r} is not a number; the form is {_FORM}") from None
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    unknown = set(query) - {"sentinel_username", "sentinel_password", "socket_timeout"}
    if unknown:
        raise RedisUrlError(
            f"unknown parameter(s) {sorted(unknown)}: only sentinel_username, "
            "sentinel_password and socket_timeout are read"
        )
    sentinel_options: dict[str, Any] = {"socket_timeout": SENTINEL_TIMEOUT_S}
    if "sentinel_username" in query:
        sentinel_options["username"] = query["sentinel_username"]
    if "sentinel_password" in query:
        sentinel_options["password"] = query["sentinel_password"]
    try:
        timeout = float(query["socket_timeout"]) if "socket_timeout" in query else None
    except ValueError:
        raise RedisUrlError(f"socket_timeout {query['socket_timeout']!r} is not seconds") from None
    return SentinelUrl(
        sentinels, unquote(path[0]), db, username, password, sentinel_options, timeout
    )


def redis_from_url(url: str, **options: Any) -> Redis:
    """An asyncio Redis client for ``url``; ``options`` as ``Redis.from_url``'s
    (``username`` / ``password`` win over those in the URL).

    With ``redis+sentinel://`` the client is redis-py's ``Sentinel(...).master_for(service)``:
    each new connection asks the sentinels for the current master, and a connection that
    finds a read-only replica (after a failover) is dropped and asked again.

    Raises:
        RedisUrlError: a ``redis+sentinel://`` URL that cannot be read (see
            :func:`parse_sentinel_url`). Other URLs are checked by redis-py (``ValueError``).
    """
    if not is_sentinel_url(url):
        return Redis.from_url(url, **options)
    from redis.asyncio.sentinel import Sentinel

    parsed = parse_sentinel_url(url)
    login: dict[str, Any] = {}
    if parsed.username is not None:
        login["username"] = parsed.username
    if parsed.password is not None:
        login["password"] = parsed.password
    login.update(options)
    if parsed.socket_timeout is not None:
        login.setdefault("socket_timeout", parsed.socket_timeout)
    sentinel = Sentinel(parsed.sentinels, sentinel_kwargs=dict(parsed.sentinel_options))
    client: Redis = sentinel.master_for(parsed.service, db=parsed.db, **login)
    return client


def redis_client(settings: LokiSettings, **options: Any) -> Redis:
    """The service's Redis client: ``settings.redis_url`` logged in as
    ``settings.redis_options()`` (``LOKI_REDIS_USER`` / ``LOKI_REDIS_PASSWORD``); ``options``:
    more ``Redis`` keyword arguments (``decode_responses``...).

    Raises:
        RedisUrlError: a ``redis+sentinel://`` URL that cannot be read.
    """
    return redis_from_url(settings.redis_url, **settings.redis_options(), **options)


def single_address(url: str) -> tuple[str, int]:
    """``(host, port)`` of a plain ``redis://`` / ``rediss://`` URL, for tools that talk to
    one server (``redis-cli``).

    Raises:
        RedisUrlError: a ``redis+sentinel://`` URL (no single server: ask a sentinel with
            ``SENTINEL get-master-addr-by-name <service>``), or a ``unix://`` one.
    """
    if is_sentinel_url(url):
        raise RedisUrlError(
            "LOKI_REDIS_URL names Redis through Sentinel: this tool needs one server "
            "(redis://host:port/db); ask a sentinel for the master with "
            "`redis-cli -p 26379 SENTINEL get-master-addr-by-name <service>`"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise RedisUrlError(f"{parts.scheme}:// has no host and port; use redis://host:port/db")
    return parts.hostname, parts.port or 6379
