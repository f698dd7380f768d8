"""The engine pool (issue 44): several llama-servers followed as one (``LOKI_ENGINE_URLS``).

``LOKI_ENGINE_URLS`` is a comma-separated list of ``[name[@group]=]url`` entries
(:func:`parse_engine_urls`). Each engine is followed like ``LOKI_ENGINE_URL`` (one
:class:`~loki_supervisor.engine_process.EngineRunner` in follow mode each: ``/health`` polled,
``/props`` and ``/slots`` read when it becomes healthy). At most one entry is ``local``: the
llama-server this supervisor launches from the active local preset, whose runner is the
supervisor's own (launched, restarted and stopped by the supervisor, never by the pool; its
state changes reach the pool through
:meth:`~loki_supervisor.pool_mode.PoolMode.local_event`). Every state change
of one engine is passed on as an :class:`~loki_shared.messages.engine.EngineState` naming the
engine (``EngineState.engine``).

The pool says which engines are ready (:meth:`EnginePool.ready`, optionally those of one
engine group: a preset's ``ENGINE_GROUP`` feature), what each has (:class:`PooledEngine`:
``total_slots``, per-slot ``n_ctx``, model) and counts what the router did on each
(:class:`EngineCounters`); :meth:`EnginePool.summaries` is the ``EngineInfo.engines`` list.
Which slot a request gets is decided elsewhere (:mod:`loki_supervisor.affinity`, applied by
:mod:`loki_supervisor.lease_book`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from urllib.parse import urlsplit

from loki_shared.messages.engine import EngineState, EngineStateName, EngineSummary, SlotSummary

from .engine_process import EngineRunner
from .probe import ProbeCache
from .slot_book import SlotBook

#: The group of an engine whose entry names none.
DEFAULT_GROUP = "default"
#: What an engine name or group may hold (it appears in queue names, subjects' payloads and
#: Prometheus labels): letters, digits, ``.``, ``_``, ``:``, ``-``; 1 to 64 characters.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")

#: The entry's URL that names the engine this supervisor launches (``local``, ``name=local``).
LOCAL_URL = "local"
#: The id of a ``local`` entry without a name.
LOCAL_ID = "local"

#: ``on_state(engine_id, event)``: one engine's state changed.
PoolStateCallback = Callable[[str, EngineState], Awaitable[None]]


@dataclass(frozen=True)
class EngineSpec:
    """One entry of ``LOKI_ENGINE_URLS``: ``id`` (its name, else ``host:port``, ``local``
    for a ``local`` entry), ``group`` (``default`` unless named), ``url`` (the llama-server
    root, no trailing ``/``; "" for a ``local`` entry) and ``local`` (the engine this
    supervisor launches from the active local preset)."""

    id: str
    group: str
    url: str
    local: bool = False


def parse_engine_urls(text: str) -> list[EngineSpec]:
    """Parse ``LOKI_ENGINE_URLS``: comma-separated ``[name[@group]=]url`` entries, in order
    (semicolons, spaces and new lines separate too; quotes around entries are dropped).

    ``gpu0@fast=http://10.0.0.2:8080`` names the engine ``gpu0`` in group ``fast``;
    ``http://10.0.0.3:8080`` is the engine ``10.0.0.3:8080`` of group ``default``. ``local``
    (or ``name=local``, ``name@group=local``; id ``local`` unless named) is the llama-server
    this supervisor launches from the active local preset. Blank
    entries (a trailing comma) are skipped; an empty string is no pool (``[]``). A trailing
    ``/`` and an OpenAI ``/v1`` suffix are dropped (``http://h:8080/v1/`` is the server at
    ``http://h:8080``); the scheme and host are case-insensitive.

    Raises:
        ValueError: an entry without an ``http://`` or ``https://`` URL with a host, a name or
            group with other characters than letters, digits, ``._:-`` (at most 64), two
            entries with the same id, two entries naming the same server (scheme, host,
            port, path) under different names, or two ``local`` entries (each message names
            the entry).
    """
    specs: list[EngineSpec] = []
    seen: set[str] = set()
    servers: dict[tuple[str, str, int, str], str] = {}
    local: str | None = None
    for raw in _entries(text):
        entry = raw.strip()
        if not entry:
            continue
        name = group = None
        url = entry
        head, sep, tail = entry.partition("=")
        if sep and "://" not in head:
            url = tail.strip()
            label = head.strip()
            name, at, grp = label.partition("@")
            name = name.strip()
            group = grp.strip() if at else None
            if not _NAME.fullmatch(name):
                raise ValueError(
                    f"LOKI_ENGINE_URLS entry {entry!r}: the name {name!r} must be 1-64 letters, "
                    "digits or ._:- (form: [name[@group]=]url)"
                )
            if group is not None and not _NAME.fullmatch(group):
                raise ValueError(
                    f"LOKI_ENGINE_URLS entry {entry!r}: the group {group!r} must be 1-64 "
                    "letters, digits or ._:-"
                )
        if url.strip().lower() == LOCAL_URL:
            name = name or LOCAL_ID
            if local is not None:
                raise ValueError(
                    f"LOKI_ENGINE_URLS entry {entry!r}: one local engine at most "
                    f"({local!r} is already the engine this supervisor launches)"
                )
            if name in seen:
                raise ValueError(f"LOKI_ENGINE_URLS: the engine {name!r} is named twice")
            local = name
            seen.add(name)
            specs.append(EngineSpec(id=name, group=group or DEFAULT_GROUP, url="", local=True))
            continue
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"LOKI_ENGINE_URLS entry {entry!r}: {url!r} is not an http(s) URL with a host "
                "nor 'local' (form: [name[@group]=]url, e.g. gpu0=http://10.0.0.2:8080)"
            )
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"LOKI_ENGINE_URLS entry {entry!r}: bad port ({exc})") from exc
        if name is None:
            host = parts.hostname
            host = f"[{host}]" if ":" in host else host
            name = f"{host}:{port or (443 if parts.scheme == 'https' else 80)}"
        if name in seen:
            raise ValueError(f"LOKI_ENGINE_URLS: the engine {name!r} is named twice")
        root = _engine_root(url)
        where = _same_server_key(parts.scheme, parts.hostname, port, root)
        if where in servers:
            raise ValueError(
                f"LOKI_ENGINE_URLS: {url!r} ({name!r}) is the same llama-server as "
                f"{servers[where]!r}: one server's slots cannot be two engines"
            )
        seen.add(name)
        servers[where] = name
        specs.append(EngineSpec(id=name, group=group or DEFAULT_GROUP, url=root))
    return specs


def _entries(text: str) -> list[str]:
    """The entries of ``LOKI_ENGINE_URLS`` as people write them: separated by commas,
    semicolons, spaces or new lines (a YAML block), the whole value or an entry possibly in
    quotes kept by an env file; spaces around ``=`` and ``@`` belong to the entry."""
    text = re.sub(r"\s*([=@])\s*", r"\1", text.strip().strip("\"'"))
    out: list[str] = []
    for piece in re.split(r"[,;\n]+", text):
        entry = ""
        for word in piece.split():
            if "://" in entry:  # a space after a URL ends the entry
                out.append(entry)
                entry = ""
            entry = f"{entry} {word}" if entry else word
        out.append(entry)
    return [part.strip().strip("\"'") for part in out]


def _engine_root(url: str) -> str:
    """The llama-server root of an entry's URL: trailing ``/`` and an OpenAI ``/v1`` suffix
    removed (``/health``, ``/props``, ``/slots`` live at the root, as with an external
    preset's base URL)."""
    root = url.rstrip("/")
    if root.lower().endswith("/v1"):
        root = root[:-3].rstrip("/")
    return root


def _same_server_key(
    scheme: str, host: str, port: int | None, root: str
) -> tuple[str, str, int, str]:
    """What makes two entries the same server: scheme, host (case-insensitive), port (the
    scheme's default when absent) and path."""
    path = urlsplit(root).path.rstrip("/")
    return (scheme, host.lower(), port or (443 if scheme == "https" else 80), path)


@dataclass
class EngineCounters:
    """What the router did on one engine since the supervisor started: ``grants`` (leases
    granted there), ``moves_in`` (grants of a conversation whose longest prefix was on another
    engine), ``restores`` (slot files restored before a grant), ``saves`` (slots saved)."""

    grants: int = 0
    moves_in: int = 0
    restores: int = 0
    saves: int = 0


@dataclass
class PooledEngine:
    """One pooled engine: its entry, its runner (state, ``/props``; for the ``local`` entry,
    the supervisor's own launch runner), its position in ``LOKI_ENGINE_URLS`` (``order``,
    the router's tie-break) and its counters."""

    spec: EngineSpec
    runner: EngineRunner
    order: int
    counters: EngineCounters = field(default_factory=EngineCounters)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def local(self) -> bool:
        """The engine this supervisor launches (the ``local`` entry)."""
        return self.spec.local

    @property
    def ready(self) -> bool:
        """``/health`` answered 200 and ``/props`` was read (the local engine: launched and
        ready, not replaced by an external preset's API)."""
        return self.runner.state == "ready" and not self.runner.external

    @property
    def total_slots(self) -> int:
        """``/props`` ``total_slots`` (else the length of ``/slots``); at least 1 once ready
        (an engine that says neither, e.g. an older server started with ``--no-slots``, has
        one slot, as with ``LOKI_ENGINE_URL``); 0 until ready."""
        total = self.runner.props.total_slots
        return max(1, total) if self.ready else total

    @property
    def slot_n_ctx(self) -> list[int]:
        """Per-slot ``n_ctx`` (tokens; from ``/slots``, else ``/props``)."""
        return list(self.runner.props.slot_n_ctx)

    @property
    def n_ctx(self) -> int:
        """The smallest slot's ``n_ctx`` (tokens; 0 until ready)."""
        slots = [n for n in self.runner.props.slot_n_ctx if n > 0]
        return min(slots) if slots else 0

    @property
    def model(self) -> str:
        """The model id (``/v1/models``, else the model file's name)."""
        return self.runner.props.model

    @property
    def model_path(self) -> str:
        """``/props`` ``model_path`` ("" when not said)."""
        return self.runner.props.model_path or ""


class EnginePool:
    """The engines of ``LOKI_ENGINE_URLS``: the followed ones, and the local one.

    Args:
        specs: the parsed entries (:func:`parse_engine_urls`; at least one).
        on_state: awaited with the engine's id and the event on every state change of one
            followed engine (the event's ``engine`` is that id; the local engine's events are
            the supervisor's).
        api_key: the key sent to every engine (``LOKI_ENGINE_API_KEY``; None: none).
        probes: the chat template probe cache shared by the engines.
        local_runner: the runner of the engine this supervisor launches (the ``local``
            entry's; never started or stopped here).

    Raises:
        ValueError: ``specs`` is empty, or has a ``local`` entry without ``local_runner``.
    """

    def __init__(
        self,
        specs: list[EngineSpec],
        on_state: PoolStateCallback,
        api_key: str | None = None,
        probes: ProbeCache | None = None,
        local_runner: EngineRunner | None = None,
    ) -> None:
        if not specs:
            raise ValueError("an engine pool needs at least one engine")
        if any(spec.local for spec in specs) and local_runner is None:
            raise ValueError("a local engine entry needs the supervisor's launch runner")
        self.api_key = api_key
        self._on_state = on_state
        probes = probes or ProbeCache()
        self.engines: list[PooledEngine] = []
        for order, spec in enumerate(specs):
            if spec.local and local_runner is not None:
                runner = local_runner
            else:
                runner = EngineRunner(self._relay(spec.id), probes=probes)
            self.engines.append(PooledEngine(spec, runner, order))
        #: the local engine (the ``local`` entry), if any
        self.local: PooledEngine | None = next((e for e in self.engines if e.local), None)
        self._by_id = {e.id: e for e in self.engines}
        #: the runners follow their engines (:meth:`follow` ran, :meth:`stop` did not since)
        self.following = False

    def _relay(self, engine_id: str) -> Callable[[EngineState], Awaitable[None]]:
        async def relay(event: EngineState) -> None:
            event.engine = engine_id
            await self._on_state(engine_id, event)

        return relay

    # ------------------------------------------------------------------ lifecycle
    async def follow(self) -> None:
        """Start following every followed engine (each runner polls ``/health``; the local
        engine is launched by the supervisor); a no-op while already following."""
        if self.following:
            return
        self.following = True
        for engine in self.followed:
            await engine.runner.run_follow(engine.spec.url, self.api_key)
            engine.runner.notes = [f"following the engine {engine.id} at {engine.spec.url}"]

    async def stop(self) -> None:
        """Stop following (an external preset replaced the pool): every followed engine
        ``stopped`` (the local one is the supervisor's to stop)."""
        self.following = False
        for engine in self.followed:
            await engine.runner.stop()

    async def close(self) -> None:
        """Stop following and close the followed runners' HTTP clients."""
        self.following = False
        for engine in self.followed:
            await engine.runner.close()

    @property
    def followed(self) -> list[PooledEngine]:
        """The engines followed at a URL (all but the local one), in order."""
        return [e for e in self.engines if not e.local]

    # ------------------------------------------------------------------ queries
    def get(self, engine_id: str) -> PooledEngine | None:
        """The engine of that id, or None."""
        return self._by_id.get(engine_id)

    def counter_values(self) -> dict[str, dict[str, int]]:
        """Every engine's :class:`EngineCounters` as data (engine id -> name -> count)."""
        return {e.id: asdict(e.counters) for e in self.engines}

    def set_counters(self, values: Mapping[str, object]) -> None:
        """Set the counters from :meth:`counter_values`' data (a new leader goes on
        counting where the previous one stopped); engines or names it does not know, and
        values that are not whole numbers, are ignored."""
        names = {f.name for f in fields(EngineCounters)}
        for engine_id, counts in values.items():
            engine = self.get(engine_id)
            if engine is None or not isinstance(counts, dict):
                continue
            for name, value in counts.items():
                if name in names and isinstance(value, int) and not isinstance(value, bool):
                    setattr(engine.counters, name, value)

    def ready(self, group: str | None = None) -> list[PooledEngine]:
        """The ready engines with at least one slot, in ``LOKI_ENGINE_URLS`` order; only
        those of ``group`` when one is given (a preset's ``ENGINE_GROUP``; None or "": all)."""
        return [
            e
            for e in self.engines
            if e.ready and e.total_slots > 0 and (not group or e.spec.group == group)
        ]

    @property
    def state(self) -> EngineStateName:
        """The pool's state: ``ready`` while one engine is, else ``starting`` while one
        starts, else ``failed`` when one failed, else ``stopped``."""
        states = {e.runner.state for e in self.engines}
        for name in ("ready", "starting", "failed"):
            if name in states:
                return name
        return "stopped"

    @property
    def detail(self) -> str:
        """One line: how many engines are ready, and why each of the others is not."""
        ready = [e for e in self.engines if e.ready]
        down = [f"{e.id}: {e.runner.detail or e.runner.state}" for e in self.engines if not e.ready]
        text = f"{len(ready)} of {len(self.engines)} engines ready"
        return f"{text} ({'; '.join(down)})" if down else text

    def summaries(
        self,
        book: SlotBook,
        load: Mapping[tuple[str, int], tuple[int, int]],
        now: float | None = None,
    ) -> list[EngineSummary]:
        """``EngineInfo.engines``: one :class:`EngineSummary` per engine, in order.

        Args:
            book: what each slot last ran (conversation, prompt, saved).
            load: ``(engine, id_slot) -> (leases held, requests waiting)`` for that slot.
            now: ``time.monotonic()`` (the book's clock; ``last_used`` is converted to
                Unix time with it).
        """
        mono = time.monotonic() if now is None else now
        wall = time.time()
        out: list[EngineSummary] = []
        for e in self.engines:
            slots: list[SlotSummary] = []
            for k in range(e.total_slots if e.ready else 0):
                held, waiting = load.get((e.id, k), (0, 0))
                entry = book.entry(e.id, k)
                slots.append(
                    SlotSummary(
                        id_slot=k,
                        busy=held > 0,
                        waiting=waiting,
                        conversation=entry.conversation if entry else None,
                        prefix=len(entry.fingerprints) if entry and entry.conversation else 0,
                        saved=bool(entry and entry.saved),
                        last_used=wall - (mono - entry.last_used)
                        if entry and entry.last_used > 0
                        else 0.0,
                    )
                )
            held_n = sum(h for (eid, _), (h, _) in load.items() if eid == e.id)
            wait_n = sum(w for (eid, _), (_, w) in load.items() if eid == e.id)
            replaced = e.local and e.runner.external  # an external preset is served instead
            out.append(
                EngineSummary(
                    id=e.id,
                    group=e.spec.group,
                    source="local" if e.local else "followed",
                    base_url="" if replaced else e.runner.base_url or e.spec.url,
                    state="stopped" if replaced else e.runner.state,
                    detail="an external preset is active: not launched"
                    if replaced
                    else e.runner.detail,
                    model=e.model,
                    n_ctx=e.n_ctx,
                    total_slots=e.total_slots,
                    in_flight=held_n,
                    waiting=wait_n,
                    slots=slots,
                    grants=e.counters.grants,
                    moves_in=e.counters.moves_in,
                    restores=e.counters.restores,
                    saves=e.counters.saves,
                )
            )
        return out
