"""Settings base shared by every service.

Configuration is read from ``LOKI_*`` environment variables when a service starts (never at
import time): each service defines ``class Settings(LokiSettings)`` with its own fields and
builds one instance in its ``__main__``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class LokiSettings(BaseSettings):
    """Fields every service reads.

    Environment variables (prefix ``LOKI_``):

    - ``LOKI_HOME`` — data directory (default ``./data``); holds the service key file
      (``secret.key``), Redis and JetStream data in the embedded default, engine slot files.
    - ``LOKI_NATS_URL`` — NATS server URL (default ``nats://127.0.0.1:4222``).
    - ``LOKI_REDIS_URL`` — Redis URL (default ``redis://127.0.0.1:6379/0``).
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
    redis_url: str = Field(default="redis://127.0.0.1:6379/0", description="Redis URL.")
    secret_key: SecretStr | None = Field(
        default=None,
        description="Service sealing key (base64 of 32 bytes, or any passphrase-like string).",
    )
    log_level: str = Field(default="INFO", description="Logging level.")
    stop_timeout_s: float = Field(
        default=10.0, gt=0, description="Seconds a service takes at most to stop."
    )
