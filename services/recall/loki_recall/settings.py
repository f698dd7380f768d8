"""Settings of the recall service (``LOKI_*`` environment variables)."""

from __future__ import annotations

from pydantic import Field

from loki_shared.settings import LokiSettings


class Settings(LokiSettings):
    """The shared fields (see :class:`loki_shared.settings.LokiSettings`) and:

    - ``LOKI_RECALL_WORKERS`` — requests handled at once per subject (default 8).
    - ``LOKI_RECALL_MEMORY_POLL_S`` — seconds between two ``loki.memory.status`` questions to
      the gateway (default 15; the key also arrives at once on ``loki.memory.key``).
    - ``LOKI_RECALL_SNAPSHOT`` — save the search index to ``LOKI_HOME/recall-index.snap``
      (sealed with the service key) so a restart reads only newer blocks (default true).
    """

    recall_workers: int = Field(default=8, ge=1, description="Concurrent requests per subject.")
    recall_snapshot: bool = Field(default=True, description="Save the index snapshot.")
    recall_memory_poll_s: float = Field(
        default=15.0, gt=0, description="Seconds between memory status polls."
    )
