"""The stores' credentials: one NATS password and one Redis password per user of
:data:`loki_shared.permissions.USERS` (and the Redis health user), generated once.

- ``loki up``: :func:`ensure` creates ``LOKI_HOME/credentials.json`` (mode 0600) on the first
  start and reads it on every later one; the launcher starts nats-server with the
  configuration :func:`write_nats_config` writes from it (``LOKI_HOME/run/nats.conf``, 0600)
  and Redis with the ACL users of :func:`write_redis_config`, and gives each service its own
  users only
  (:func:`service_env`).
- Docker Compose: ``python -m loki_shared.credentials init DIR`` (the compose service
  ``loki-secrets``, run before the others) writes the same file into DIR once, then from it one
  subfolder per container (:func:`init_folder`): ``nats/``, ``redis/`` and one per user.

A service reads its own credentials from ``LOKI_NATS_USER`` / ``LOKI_NATS_PASSWORD`` /
``LOKI_REDIS_USER`` / ``LOKI_REDIS_PASSWORD`` (:class:`loki_shared.settings.LokiSettings`, at
start-up).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from . import permissions

#: The credentials file, under LOKI_HOME (``loki up``) or the compose secrets folder.
FILE = "credentials.json"
#: The nats-server configuration ``loki up`` writes, under LOKI_HOME.
NATS_CONF = Path("run") / "nats.conf"
#: The Redis configuration (its ACL users) ``loki up`` writes, under LOKI_HOME.
REDIS_CONF = Path("run") / "redis.conf"
#: Bytes of randomness per password (URL-safe base64: 43 characters).
PASSWORD_BYTES = 32


class CredentialsError(RuntimeError):
    """The credentials file is unreadable or incomplete; the message names it."""


@dataclass(frozen=True)
class Credentials:
    """Every password of one installation.

    Attributes:
        nats: NATS user -> password, one for every user of ``permissions.USERS``.
        redis: Redis ACL user -> password, one for each of ``permissions.redis_users()``.
    """

    nats: dict[str, str]
    redis: dict[str, str]

    @classmethod
    def generate(cls) -> Credentials:
        """Fresh random passwords (``secrets.token_urlsafe``, 256 bits each)."""
        return cls(
            nats={row.user: _password() for row in permissions.USERS},
            redis={user: _password() for user in permissions.redis_users()},
        )

    def to_json(self) -> dict[str, object]:
        return {"nats": dict(self.nats), "redis": dict(self.redis)}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Credentials:
        """A file of before issue 36 (one Redis password, a string) reads with no Redis
        passwords: :func:`ensure` then generates them.

        Raises: CredentialsError: a field is missing or not a string."""
        nats, redis = data.get("nats"), data.get("redis")
        if isinstance(redis, str):
            redis = {}
        if not isinstance(nats, dict) or not isinstance(redis, dict):
            raise CredentialsError("credentials: 'nats' and 'redis' (objects) expected")
        for table in (nats, redis):
            if not all(isinstance(k, str) and isinstance(v, str) and v for k, v in table.items()):
                raise CredentialsError("credentials: every password must be a string")
        return cls(nats=dict(nats), redis=dict(redis))


def _password() -> str:
    return secrets.token_urlsafe(PASSWORD_BYTES)


def _write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write ``text`` to ``path`` atomically, the file created with ``mode``."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def load(path: Path) -> Credentials:
    """Read a credentials file.

    Raises:
        CredentialsError: unreadable, not JSON, or missing a field.
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CredentialsError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise CredentialsError(f"{path}: a JSON object expected")
    return Credentials.from_json(data)


def ensure(folder: Path, mode: int = 0o600) -> Credentials:
    """The credentials kept in ``folder/credentials.json``: created (``mode``, default 0600)
    on the first call, read on every later one. A user the table gained since is given a
    password (the file is rewritten); existing passwords never change.

    Raises:
        CredentialsError: the file exists but cannot be read.
    """
    path = folder / FILE
    if not path.exists():
        creds = Credentials.generate()
        try:  # exclusive create: two starts racing agree on one file
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            return ensure(folder, mode)
        with os.fdopen(fd, "w") as fh:
            json.dump(creds.to_json(), fh, indent=1)
        return creds
    creds = load(path)
    missing = [row.user for row in permissions.USERS if row.user not in creds.nats]
    missing_redis = [u for u in permissions.redis_users() if u not in creds.redis]
    if missing or missing_redis:
        creds = Credentials(
            {**creds.nats, **{u: _password() for u in missing}},
            {**creds.redis, **{u: _password() for u in missing_redis}},
        )
        _write_private(path, json.dumps(creds.to_json(), indent=1), mode)
    return creds


def write_nats_config(
    path: Path,
    creds: Credentials,
    extra: dict[str, tuple[str, dict[str, object]]] | None = None,
    mode: int = 0o600,
) -> Path:
    """Write nats-server's ``authorization`` configuration for ``creds`` to ``path``
    (``mode``, default 0600) and return ``path``. See :func:`permissions.nats_config`."""
    _write_private(path, permissions.nats_config(creds.nats, extra or {}), mode)
    return path


def write_redis_config(
    path: Path,
    creds: Credentials,
    extra: dict[str, tuple[str, list[str]]] | None = None,
    mode: int = 0o600,
) -> Path:
    """Write Redis's configuration file (its ACL users, ``default`` off: see
    :func:`permissions.redis_config`) to ``path`` (``mode``) and return ``path``."""
    _write_private(path, permissions.redis_config(creds.redis, extra or {}), mode)
    return path


def service_env(creds: Credentials, user: str) -> dict[str, str]:
    """The ``LOKI_*`` variables that log ``user`` in: its NATS user and password, and its
    Redis ACL user (same name) and password.

    Raises:
        KeyError: ``user`` has no password in ``creds``.
    """
    return {
        "LOKI_NATS_USER": user,
        "LOKI_NATS_PASSWORD": creds.nats[user],
        "LOKI_REDIS_USER": user,
        "LOKI_REDIS_PASSWORD": creds.redis[user],
    }


#: Where a comma-separated list of URLs (a NATS cluster's nodes) starts its next URL.
_NEXT_URL = re.compile(r",\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)")


def _each_url(url: str, change: Callable[[str], str]) -> str:
    """``change`` applied to each URL of a comma-separated list (``nats://a,nats://b``); a
    single URL (a ``redis+sentinel://h1,h2/...`` one included) is one item."""
    return ",".join(change(one) for one in _NEXT_URL.split(url))


def with_userinfo(url: str, user: str | None, password: str | None) -> str:
    """``url`` with ``user:password@`` in its authority (``redis://:pw@host:port/0`` when
    ``user`` is None): the form nats-py and redis-py read credentials from; each URL of a
    comma-separated list gets it. Never log it."""
    if password is None and user is None:
        return url
    if len(_NEXT_URL.split(url)) > 1:
        return _each_url(url, lambda one: with_userinfo(one, user, password))
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    auth = quote(user or "", safe="")
    if password is not None:
        auth += ":" + quote(password, safe="")
    return urlunsplit(parts._replace(netloc=f"{auth}@{host}"))


def without_userinfo(url: str) -> str:
    """``url`` with no ``user:password@`` in it (in each URL of a comma-separated list)."""
    if len(_NEXT_URL.split(url)) > 1:
        return _each_url(url, without_userinfo)
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))


def redact(url: str) -> str:
    """``url`` with any password in it replaced by ``***`` (for messages and logs; in each URL
    of a comma-separated list)."""
    if len(_NEXT_URL.split(url)) > 1:
        return _each_url(url, redact)
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, host = parts.netloc.rsplit("@", 1)
    name = user.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))


def url_login(url: str) -> dict[str, str]:
    """nats-py options that go with a NATS URL carrying ``user:password@``: the user's own
    reply-inbox prefix (:func:`loki_shared.permissions.inbox_prefix`); empty without a user."""
    user = urlsplit(url).username
    return {"inbox_prefix": permissions.inbox_prefix(user)} if user else {}


def init_folder(folder: Path) -> Credentials:
    """The compose init step: the credentials (kept, or created once) in
    ``folder/credentials.json`` (0600) and, from them, one subfolder per container, each
    mounted read-only into that container only:

    - ``nats/nats.conf``: the ``authorization`` block (:func:`write_nats_config`);
    - ``redis/redis.conf`` (the ACL users) and ``redis/password`` (the password of the health
      check's user, :data:`permissions.REDIS_HEALTH_USER`);
    - ``<user>/`` for every user of the table: ``loki_nats_user``, ``loki_nats_password``,
      ``loki_redis_user``, ``loki_redis_password``, read through ``LOKI_SECRETS_DIR``
      (:class:`loki_shared.settings.LokiSettings`).

    ``folder`` is made 0700 (only its owner reaches it on the host); the subfolders 0755 and
    their files 0644, since each container (running as its own uid) reads its subfolder
    through its own mount only. Rerunning it changes nothing but a user the table gained.

    Raises:
        CredentialsError: an existing credentials file cannot be read.
    """
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    creds = ensure(folder)
    files: dict[str, str] = {
        "nats/nats.conf": permissions.nats_config(creds.nats),
        "redis/redis.conf": permissions.redis_config(creds.redis),
        "redis/password": creds.redis[permissions.REDIS_HEALTH_USER],
    }
    for row in permissions.USERS:
        for key, value in service_env(creds, row.user).items():
            files[f"{row.user}/{key.lower()}"] = value
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(exist_ok=True)
        os.chmod(path.parent, 0o755)
        _write_private(path, text, 0o644)
    return creds


def main(argv: list[str] | None = None) -> int:
    """``python -m loki_shared.credentials init DIR``: see :func:`init_folder`."""
    parser = argparse.ArgumentParser(prog="python -m loki_shared.credentials")
    parser.add_argument("action", choices=["init"])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    try:
        init_folder(args.folder)
    except CredentialsError as exc:
        print(f"loki credentials: {exc}", file=sys.stderr)
        return 1
    print(f"credentials ready in {args.folder}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
