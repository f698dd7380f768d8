"""Benchmark runs and optimiser searches in Redis, sealed with the service key.

Redis layout:

- ``loki:engine:bench:runs`` (list, oldest first, at most :data:`MAX_RUNS`): each item a
  :class:`BenchRun` JSON sealed (AES-GCM, associated data ``loki:engine:bench:run``);
- ``loki:engine:optimise:<preset id>``: the preset's last :class:`OptimiseResult`, sealed
  (associated data ``loki:engine:optimise:<preset id>``).

A run is filed under its preset, model and engine build (:func:`run_key`); a blob that does
not open (another key, tampering) is skipped, never shown.
"""

from __future__ import annotations

from redis.asyncio import Redis

from loki_shared.messages.engine import BenchRun, OptimiseResult
from loki_shared.sealing import Sealer, SealError

RUNS_KEY = "loki:engine:bench:runs"
OPTIMISE_PREFIX = "loki:engine:optimise:"
MAX_RUNS = 200
_RUN_AAD = b"loki:engine:bench:run"


def run_key(run: BenchRun) -> tuple[str, str, str]:
    """What a run is filed under: ``(preset_id, model, build)``."""
    return run.preset_id, run.model, run.build


class BenchStore:
    """Stored runs and searches (see the module docstring).

    Args:
        redis: an asyncio Redis client (``decode_responses=False``).
        sealer: the service sealer.
    """

    def __init__(self, redis: Redis, sealer: Sealer) -> None:
        self.redis = redis
        self.sealer = sealer

    async def add(self, run: BenchRun) -> None:
        """Append a run (the oldest beyond :data:`MAX_RUNS` dropped)."""
        blob = self.sealer.seal(run.model_dump_json().encode(), _RUN_AAD)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.rpush(RUNS_KEY, blob)
            pipe.ltrim(RUNS_KEY, -MAX_RUNS, -1)
            await pipe.execute()

    async def runs(self) -> list[BenchRun]:
        """Every stored run that opens, oldest first."""
        out: list[BenchRun] = []
        for blob in await self.redis.lrange(RUNS_KEY, 0, -1):
            try:
                out.append(BenchRun.model_validate_json(self.sealer.open(blob, _RUN_AAD)))
            except (SealError, ValueError):
                continue
        return out

    async def runs_of(self, preset_id: str) -> list[BenchRun]:
        """The stored runs of one preset (every model and build), oldest first."""
        return [r for r in await self.runs() if r.preset_id == preset_id]

    async def latest(self) -> list[BenchRun]:
        """The newest run of each preset, model and build."""
        newest: dict[tuple[str, str, str], BenchRun] = {}
        for run in await self.runs():
            newest[run_key(run)] = run
        return list(newest.values())

    async def save_search(self, result: OptimiseResult) -> None:
        """Keep a preset's last optimiser search (its table and proposal)."""
        key = OPTIMISE_PREFIX + result.preset_id
        blob = self.sealer.seal(result.model_dump_json().encode(), key.encode())
        await self.redis.set(key, blob)

    async def search(self, preset_id: str) -> OptimiseResult | None:
        """A preset's last optimiser search (None: none, or it does not open)."""
        key = OPTIMISE_PREFIX + preset_id
        blob = await self.redis.get(key)
        if blob is None:
            return None
        try:
            return OptimiseResult.model_validate_json(self.sealer.open(blob, key.encode()))
        except (SealError, ValueError):
            return None
