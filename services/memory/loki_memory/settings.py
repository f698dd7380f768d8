"""Settings of the memory service (``LOKI_*`` environment variables, read at start-up)."""

from __future__ import annotations

from pydantic import Field

from loki_shared.settings import LokiSettings


class Settings(LokiSettings):
    """The shared fields (see :class:`loki_shared.settings.LokiSettings`) and:

    - ``LOKI_MEMORY_WORKERS`` — requests handled at once per subject (default 8).
    - ``LOKI_MEMORY_POLL_S`` — seconds between two ``loki.memory.status`` questions to the
      gateway (default 15; the key also arrives at once on ``loki.memory.key``).
    """

    memory_workers: int = Field(default=8, ge=1, description="Concurrent requests per subject.")
    memory_poll_s: float = Field(
        default=15.0, gt=0, description="Seconds between memory status polls."
    )
