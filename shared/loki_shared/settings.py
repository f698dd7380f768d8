"""Settings base shared by every service.

Configuration is read from ``LOKI_*`` environment variables when a service starts (never at
import time): each service defines ``class Settings(LokiSettings)`` with its own fields and
builds one instance in its ``__main__``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
)

#: Folder of secret files (Docker secrets style: one file per variable, named like it in
#: lower case, e.g. ``loki_nats_password``), read after the environment.
SECRETS_DIR_ENV = "LOKI_SECRETS_DIR"


class LokiSettings(BaseSettings):
    """Fields every service reads.

    Environment variables (prefix ``LOKI_``):

    - ``LOKI_HOME`` — data directory (default ``./data``); holds the service key file
      (``secret.key``), Redis and JetStream data in the embedded default, engine slot files.
    - ``LOKI_NATS_URL`` — NATS server URL (default ``nats://127.0.0.1:4222``); the nodes of a
      NATS cluster comma-separated (:func:`loki_shared.nats.nats_servers`).
    - ``LOKI_JETSTREAM_REPLICAS`` — copies of each Loki JetStream stream (default 1; 3 on a
      three-node cluster), :func:`loki_shared.nats.stream_replicas`.
    - ``LOKI_NATS_USER`` — this process's NATS user (issue 22: one user per service, see
      :mod:`loki_shared.permissions`); unset: no login (a server without authorization, or
      credentials given in the URL).
    - ``LOKI_NATS_PASSWORD`` — the password of that NATS user.
    - ``LOKI_REDIS_URL`` — Redis URL (default ``redis://127.0.0.1:6379/0``), or Redis through
      Sentinel, ``redis+sentinel://host1:26379,host2:26379/<service>/<db>``
      (:mod:`loki_shared.redis_client`).
    - ``LOKI_REDIS_USER`` — this process's Redis ACL user (issue 36: one per service, see
      :mod:`loki_shared.permissions`); unset: none (or in the URL).
    - ``LOKI_REDIS_PASSWORD`` — the password of that Redis user; unset: none (or in the URL).
    - ``LOKI_SECRETS_DIR`` — a folder of secret files, one per variable named like it in lower
      case (``loki_nats_password``...): how compose hands each container its own credentials
      (:mod:`loki_shared.credentials`). The environment wins over a file.
    - ``LOKI_SECRET_KEY`` — the service sealing key (see :mod:`loki_shared.sealing`); when unset
      a random key is created in ``LOKI_HOME/secret.key`` (mode 0600) on first start.
    - ``LOKI_LOG_LEVEL`` — ``DEBUG``, ``INFO`` (default), ``WARNING``, ``ERROR``.
    - ``LOKI_STOP_TIMEOUT_S`` — seconds a service takes at most to stop after SIGTERM, whatever
      the state of NATS, Redis and the engine (default 10).
      Keep compose's ``stop_grace_period`` above it.
    """

    model_config = SettingsConfigDict(env_prefix="LOKI_", extra="ignore")

    home: Path = Field(default=Path("./data"), description="Data directory.")
    nats_url: str = Field(default="nats://127.0.0.1:4222", description="NATS server URL.")
    nats_user: str | None = Field(default=None, description="NATS user of this process.")
    nats_password: SecretStr | None = Field(default=None, description="Its NATS password.")
    jetstream_replicas: int = Field(
        default=1, ge=1, le=5, description="Copies of each JetStream stream (3 in a cluster)."
    )
    redis_url: str = Field(default="redis://127.0.0.1:6379/0", description="Redis URL.")
    redis_user: str | None = Field(default=None, description="Redis ACL user of this process.")
    redis_password: SecretStr | None = Field(default=None, description="Its Redis password.")
    secret_key: SecretStr | None = Field(
        default=None,
        description="Service sealing key (base64 of 32 bytes, or any passphrase-like string).",
    )
    log_level: str = Field(default="INFO", description="Logging level.")
    stop_timeout_s: float = Field(
        default=10.0, gt=0, description="Seconds a service takes at most to stop."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then the environment, then the secret files of ``LOKI_SECRETS_DIR``
        (when it names a folder; else of the ``_secrets_dir`` argument, if given)."""
        folder = os.environ.get(SECRETS_DIR_ENV)
        if folder and Path(folder).is_dir():
            file_secret_settings = SecretsSettingsSource(settings_cls, folder)
        return (init_settings, env_settings, dotenv_settings, file_secret_settings)

    def nats_options(self) -> dict[str, Any]:
        """Keyword arguments of ``nats.connect`` that log this process in: ``user``,
        ``password`` and its own reply-inbox prefix (``_INBOX.<user>``, the only inbox its NATS
        user may subscribe); empty without ``LOKI_NATS_USER``."""
        from .permissions import inbox_prefix

        if not self.nats_user:
            return {}
        password = self.nats_password.get_secret_value() if self.nats_password else ""
        return {
            "user": self.nats_user,
            "password": password,
            "inbox_prefix": inbox_prefix(self.nats_user),
        }

    def redis_options(self) -> dict[str, Any]:
        """Keyword arguments of ``Redis.from_url``: ``username`` and ``password`` when set."""
        out: dict[str, Any] = {}
        if self.redis_user:
            out["username"] = self.redis_user
        if self.redis_password is not None:
            out["password"] = self.redis_password.get_secret_value()
        return out
