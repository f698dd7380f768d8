"""The memory service's Redis keys, and the guard that turns a Redis failure into
:class:`loki_shared.errors.Unavailable`.

- ``loki:projects:meta`` — hash ``<project id>`` → the project's name and creation time
  (sealed with the service key: readable while the memory is locked);
- ``loki:projects:body`` — hash ``<project id>`` → its description and instructions
  (private: see :mod:`loki_memory.vault`);
- ``loki:projects:touched`` — hash ``<project id>`` → Unix time of its latest change (a number);
- ``loki:projects:active`` — the active project's id (sealed);
- ``loki:projects:pages:<project id>`` — hash ``<field of the file>`` → the page (private);
- ``loki:projects:trackers:<project id>`` — hash ``<field of the slug>`` → name and unit
  (private);
- ``loki:projects:values:<project id>:<field of the slug>`` — list of the tracker's values in
  the order logged (each private).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import RedisError

from loki_shared.errors import Unavailable

META = "loki:projects:meta"
BODY = "loki:projects:body"
TOUCHED = "loki:projects:touched"
ACTIVE = "loki:projects:active"


def pages(project_id: str) -> str:
    """Hash of the pages of ``project_id``."""
    return f"loki:projects:pages:{project_id}"


def trackers(project_id: str) -> str:
    """Hash of the trackers of ``project_id``."""
    return f"loki:projects:trackers:{project_id}"


def values(project_id: str, field: str) -> str:
    """List of the values of the tracker whose field is ``field``."""
    return f"loki:projects:values:{project_id}:{field}"


def aad_meta(project_id: str) -> str:
    """Associated data of a project's name record."""
    return f"{META}:{project_id}"


def aad_body(project_id: str) -> str:
    """Associated data of a project's description and instructions."""
    return f"{BODY}:{project_id}"


def aad_page(project_id: str, field: str) -> str:
    """Associated data of a page (``field``: the keyed hash of its file)."""
    return f"{pages(project_id)}:{field}"


def aad_tracker(project_id: str, field: str) -> str:
    """Associated data of a tracker's record (its values: this + ``:value``)."""
    return f"{trackers(project_id)}:{field}"


#: KEYS: the meta hash, the hash written. ARGV: project id, field, blob, nx ('1': HSETNX).
#: Writes only while the project exists (a write racing its deletion leaves nothing behind);
#: returns -1 when it does not, else what HSET / HSETNX returned.
HSET_IN_PROJECT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return -1 end
if ARGV[4] == '1' then return redis.call('HSETNX', KEYS[2], ARGV[2], ARGV[3]) end
return redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
"""
#: KEYS: the meta hash, the list. ARGV: project id, then the values to append.
RPUSH_IN_PROJECT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return -1 end
return redis.call('RPUSH', KEYS[2], unpack(ARGV, 2))
"""


@contextmanager
def guard() -> Iterator[None]:
    """Turn a :class:`redis.exceptions.RedisError` raised inside into ``Unavailable``."""
    try:
        yield
    except RedisError as exc:
        raise Unavailable(f"redis: {exc}") from exc
