"""Scheduled tasks in Redis, and the claim of each due time.

Keys (values sealed with :mod:`loki_shared.sealing`; AAD = ``<key>:<field>``):

- ``loki:task:index`` — hash ``task id -> Task`` (sealed JSON);
- ``loki:task:runs:<id>`` — hash ``due -> TaskRun`` (sealed JSON; ``due`` written with
  ``repr(float)``). ``HSETNX`` of a due time's field is THE claim: the one instance whose
  write lands runs it (or records it skipped); every other instance sees the field and
  leaves it. The sealed bytes written are the claim's fencing token: the claimant updates
  the run only while the field still holds exactly what it wrote (Lua compare-and-set);
- ``loki:task:cursor:<id>`` — the latest due time already claimed (plain float; only
  raised, by a Lua max);
- ``loki:task:running`` — sorted set ``<task id>|<due field> -> lease expiry`` (epoch s) of
  the runs started and not ended: the running instance renews the lease while the run goes
  on (only while the record still holds its token); a run whose lease expired (its instance
  died mid-run) is taken over by another instance, which records it ``error`` through the
  same compare-and-set (so a late write of the dead claimant is fenced off);
- ``loki:task:active`` — sorted set ``conversation -> expiry`` of the person's turns running
  now (any instance), read by a task run before it starts.

At most :data:`RUNS_KEPT` runs are kept per task (the oldest are dropped).
"""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from loki_shared.messages.tasks import Task, TaskRun
from loki_shared.sealing import Sealer, SealError

PREFIX = "loki:task"
INDEX = f"{PREFIX}:index"
ACTIVE = f"{PREFIX}:active"
RUNNING = f"{PREFIX}:running"
#: Runs kept per task.
RUNS_KEPT = 200
#: A person's turn marked active is presumed over after this long (s) if never unmarked.
ACTIVE_MAX_S = 900.0

_UPDATE = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""
_RENEW = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return 1
"""
_FINISH = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[4])
return 1
"""
_RAISE = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '-1')
if cur < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""


def runs_key(task_id: str) -> str:
    """The hash of a task's runs (field: the due time)."""
    return f"{PREFIX}:runs:{task_id}"


def cursor_key(task_id: str) -> str:
    """The latest due time of a task already claimed."""
    return f"{PREFIX}:cursor:{task_id}"


def running_member(task_id: str, due: float) -> str:
    """A run's member in :data:`RUNNING`."""
    return f"{task_id}|{due_field(due)}"


def due_field(due: float) -> str:
    """A due time as a hash field (``repr``: the same float gives the same field)."""
    return repr(float(due))


class TaskStore:
    """Tasks, their runs and claims.

    Args:
        client: a ``redis.asyncio.Redis`` (bytes responses).
        sealer: the service sealer.
    """

    def __init__(self, client: aioredis.Redis, sealer: Sealer) -> None:
        self.r = client
        self.sealer = sealer
        self._update = client.register_script(_UPDATE)
        self._raise = client.register_script(_RAISE)
        self._renew = client.register_script(_RENEW)
        self._finish = client.register_script(_FINISH)

    def _seal(self, key: str, field: str, data: str) -> bytes:
        return self.sealer.seal(data.encode(), f"{key}:{field}".encode())

    def _open(self, key: str, field: str, blob: bytes) -> str:
        return self.sealer.open(blob, f"{key}:{field}".encode()).decode()

    # -- tasks ----------------------------------------------------------------------------
    async def put(self, task: Task) -> None:
        """Write (create or replace) a task."""
        await self.r.hset(INDEX, task.id, self._seal(INDEX, task.id, task.model_dump_json()))

    async def get(self, task_id: str) -> Task | None:
        """A task, or None when there is none by that id."""
        blob = await self.r.hget(INDEX, task_id)
        if blob is None:
            return None
        return Task.model_validate_json(self._open(INDEX, task_id, blob))

    async def all(self) -> list[Task]:
        """Every readable task, oldest first (one sealed with another key is skipped)."""
        out = []
        for tid, blob in (await self.r.hgetall(INDEX)).items():
            try:
                out.append(Task.model_validate_json(self._open(INDEX, tid.decode(), blob)))
            except (SealError, ValueError):  # sealed with another key, or not a TaskRun/Task
                continue
        out.sort(key=lambda t: t.created)
        return out

    async def delete(self, task_id: str) -> bool:
        removed = await self.r.hdel(INDEX, task_id)
        await self.r.delete(runs_key(task_id), cursor_key(task_id))
        return bool(removed)

    async def reset_cursor(self, task_id: str) -> None:
        """Forget the cursor (the schedule changed: due times count from the new anchor)."""
        await self.r.delete(cursor_key(task_id))

    # -- claims and runs ------------------------------------------------------------------
    async def cursor(self, task_id: str) -> float | None:
        """The latest due time claimed (epoch s), or None (none yet)."""
        raw = await self.r.get(cursor_key(task_id))
        return float(raw) if raw is not None else None

    async def advance(self, task_id: str, due: float) -> None:
        """Raise the cursor to ``due`` (never lowers it)."""
        await self._raise(keys=[cursor_key(task_id)], args=[due_field(due)])

    async def claim(self, run: TaskRun, lease_s: float | None = None) -> bytes | None:
        """Write ``run`` as its due time's record if no instance did: return the sealed bytes
        written (the fencing token of later updates), or None when the due time was already
        claimed. ``lease_s``: a run that will go on (status ``running``) is listed in
        :data:`RUNNING` with a lease of that many seconds (renewed by :meth:`renew`)."""
        key, field = runs_key(run.task), due_field(run.due)
        blob = self._seal(key, field, run.model_dump_json())
        if lease_s is not None:  # listed first: a claim never runs unlisted
            await self.r.zadd(RUNNING, {running_member(run.task, run.due): time.time() + lease_s})
        if not await self.r.hsetnx(key, field, blob):
            if lease_s is not None:  # another instance's claim: its listing stays
                await self._unlist_unless_running(run.task, run.due)
            return None
        if await self.r.hlen(key) > RUNS_KEPT:
            fields = sorted((f.decode() for f in await self.r.hkeys(key)), key=float)
            await self.r.hdel(key, *fields[: len(fields) - RUNS_KEPT])
        return blob

    async def _unlist_unless_running(self, task_id: str, due: float) -> None:
        rec = await self.record(task_id, due)
        if rec is None or rec[0].status != "running":
            await self.r.zrem(RUNNING, running_member(task_id, due))

    async def update(self, run: TaskRun, token: bytes) -> bytes | None:
        """Replace a claimed run's record if it still holds ``token``; return the new token
        (None: the record changed or is gone). A run no longer ``running`` leaves
        :data:`RUNNING` in the same step."""
        key, field = runs_key(run.task), due_field(run.due)
        blob = self._seal(key, field, run.model_dump_json())
        if run.status == "running":
            ok = await self._update(keys=[key], args=[field, token, blob])
        else:
            member = running_member(run.task, run.due)
            ok = await self._finish(keys=[key, RUNNING], args=[field, token, blob, member])
        return blob if ok else None

    async def renew(self, run: TaskRun, token: bytes, lease_s: float) -> bool:
        """Extend a running run's lease to ``lease_s`` from now if its record still holds
        ``token`` (False: it was taken over; the run's outcome will not be recorded)."""
        key, field = runs_key(run.task), due_field(run.due)
        member = running_member(run.task, run.due)
        args = [field, token, repr(time.time() + lease_s), member]
        return bool(await self._renew(keys=[key, RUNNING], args=args))

    async def record(self, task_id: str, due: float) -> tuple[TaskRun, bytes] | None:
        """A due time's run record and its current bytes (the token of a compare-and-set),
        or None when there is none (or it is sealed with another key)."""
        key, field = runs_key(task_id), due_field(due)
        blob = await self.r.hget(key, field)
        if blob is None:
            return None
        try:
            return TaskRun.model_validate_json(self._open(key, field, blob)), blob
        except (SealError, ValueError):  # sealed with another key, or not a TaskRun
            return None

    async def expired(self, now: float) -> list[tuple[str, float]]:
        """``(task id, due)`` of the runs whose lease ended before ``now``."""
        out = []
        for member in await self.r.zrangebyscore(RUNNING, "-inf", now):
            task_id, _, due = member.decode().partition("|")
            out.append((task_id, float(due)))
        return out

    async def unlist(self, task_id: str, due: float) -> None:
        """Drop a run from :data:`RUNNING` (its record is gone or no longer running)."""
        await self.r.zrem(RUNNING, running_member(task_id, due))

    async def runs(self, task_id: str) -> list[TaskRun]:
        """A task's runs, newest first."""
        key = runs_key(task_id)
        out = []
        for field, blob in (await self.r.hgetall(key)).items():
            try:
                out.append(TaskRun.model_validate_json(self._open(key, field.decode(), blob)))
            except (SealError, ValueError):  # sealed with another key, or not a TaskRun/Task
                continue
        out.sort(key=lambda r: r.due, reverse=True)
        return out

    # -- the person's turns -----------------------------------------------------------------
    async def mark_active(self, cid: str) -> None:
        """Mark a person's turn of conversation ``cid`` as running (expires after
        :data:`ACTIVE_MAX_S`)."""
        await self.r.zadd(ACTIVE, {cid: time.time() + ACTIVE_MAX_S})

    async def unmark_active(self, cid: str) -> None:
        """The person's turn of ``cid`` ended."""
        await self.r.zrem(ACTIVE, cid)

    async def person_busy(self) -> bool:
        """Whether a person's turn runs now on any instance (expired marks are dropped)."""
        now = time.time()
        await self.r.zremrangebyscore(ACTIVE, "-inf", now)
        return bool(await self.r.zcard(ACTIVE))
