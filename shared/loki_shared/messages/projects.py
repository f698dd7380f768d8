"""Messages of the memory service (``loki.projects.*``): projects, memory pages, trackers.

A *project* partitions the person's work: its own memory pages (Markdown, indexed by code in
``MEMORY.md``), its own trackers (dated values with a unit) and its own conversations. One
project is *active* at a time (conversations are created in it); the project
:data:`DEFAULT_PROJECT` always exists and cannot be deleted.

Shapes and units:

- times (``created_at``, ``updated_at``, ``as_of``, ``ts``) are Unix times in seconds;
- a page's ``file`` is its name in the project, ``<slug>.md`` (lower case letters, digits,
  ``-`` and ``_``; the service derives it from what is sent: ``"Diet notes"`` →
  ``diet-notes.md``); ``MEMORY.md`` is the index and is never a page;
- a tracker's ``slug`` is derived from its name the same way (``"Body weight"`` →
  ``body-weight``); a tracker value's ``date`` is ``YYYY-MM-DD``; ``value`` a float.

Error replies (``error.type``, raised by :mod:`loki_shared.projects_client` as the
:mod:`loki_shared.errors` class of that name): ``not_found`` (no such project, page or
tracker), ``invalid_request`` (a bad name, file, date, value, level or period; the message
says what to resend), ``conflict`` (deleting the default project, a delete whose ``confirm``
is not the project's id, a duplicate project id), ``locked`` (the memory is encrypted and
locked: pages, trackers, descriptions and instructions cannot be read or written),
``unavailable`` (Redis not reachable), ``internal``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Msg, Reply
from .recall import DEFAULT_PROJECT

__all__ = ["DEFAULT_PROJECT"]

#: The reading levels of a tracker, coarse to fine (see :class:`TrackerReadRequest`).
TrackerLevel = Literal["overview", "year", "month", "events"]

#: What changed in a project (:class:`ProjectChangedEvent`).
ChangeKind = Literal["page", "tracker", "description", "instructions", "name", "created", "deleted"]


# --- the records -------------------------------------------------------------------------
class Project(Msg):
    """A project. ``id`` is a subject-safe slug (``default`` for the default project);
    ``instructions`` is the project's instructions file text (empty: none). While the memory
    is locked, ``description`` and ``instructions`` read as empty and ``locked`` is True."""

    id: str
    name: str
    description: str = ""
    instructions: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    locked: bool = False


class PageMeta(Msg):
    """A page without its text: ``title`` is the page's first ``# `` heading (else its file
    stem); ``description`` is one line (given when written, kept when a later write omits it)."""

    file: str
    title: str
    description: str = ""
    updated_at: float = 0.0


class Page(PageMeta):
    """A page with its Markdown ``content``."""

    content: str = ""


class TrackerValue(Msg):
    """One dated value of a tracker: ``date`` ``YYYY-MM-DD``, ``value``, optional ``note``."""

    date: str
    value: float
    note: str = ""


class Tracker(Msg):
    """A tracker: ``slug`` (its key), ``name`` as first given, ``unit`` (may be empty),
    ``count`` of values, ``latest`` (the value with the greatest date; the last logged among
    equal dates), None when it has no value."""

    slug: str
    name: str
    unit: str = ""
    count: int = 0
    latest: TrackerValue | None = None


class TrackerPeriod(Msg):
    """A summary of a tracker's values over one period (a year ``YYYY``, a month ``YYYY-MM``
    or a day ``YYYY-MM-DD``): how many, first and last date, min, max, mean and the last
    value of the period."""

    period: str
    count: int
    first: str
    last: str
    min: float
    max: float
    mean: float
    last_value: float


class SearchHit(Msg):
    """One page matching a search: ``score`` (higher is better), the ``snippet`` (the best
    matching line of the page, cut to about 200 characters)."""

    file: str
    title: str
    description: str = ""
    score: float
    snippet: str = ""


class ProjectBlock(Msg):
    """What the chat service needs to build the project block of a conversation.

    Attributes:
        project_id, name: the project.
        description: the project's description (full text; may be empty).
        instructions: the project's instructions file text (empty: none).
        index: the lines of ``MEMORY.md``, one per page sorted by file,
            ``- [Title](file.md) — description`` (``- [Title](file.md)`` when the description
            is empty); the key of a line is its ``](file.md)`` part.
        trackers: tracker slug -> its latest-value line, sorted by slug:
            ``- name: value unit (YYYY-MM-DD)`` (``- name: no value yet`` when empty; a note
            is appended as `` — note``).
        as_of: Unix time of the latest change reflected in the block (the greatest
            ``updated_at`` of the project, its pages and trackers).
    """

    project_id: str
    name: str
    description: str = ""
    instructions: str = ""
    index: list[str] = Field(default_factory=list)
    trackers: dict[str, str] = Field(default_factory=dict)
    as_of: float = 0.0


# --- projects ----------------------------------------------------------------------------
class ProjectsListRequest(Msg):
    """``loki.projects.list``: every project."""


class ProjectsReply(Reply):
    """Every project, sorted by name (the default project first), and the active one's id."""

    projects: list[Project] = Field(default_factory=list)
    active: str = DEFAULT_PROJECT


class ProjectCreateRequest(Msg):
    """``loki.projects.create``: a new project named ``name`` (1-80 characters). ``id``:
    None derives it from the name (made unique with ``-2``, ``-3``...); given, it must be a
    free slug."""

    name: str
    description: str = ""
    instructions: str = ""
    id: str | None = None


class ProjectUpdateRequest(Msg):
    """``loki.projects.update``: change what is given (None: keep)."""

    project_id: str
    name: str | None = None
    description: str | None = None
    instructions: str | None = None


class ProjectReply(Reply):
    """One project (``loki.projects.create``, ``.update``, ``.active``, ``.activate``,
    ``.import``)."""

    project: Project | None = None


class ProjectDeleteRequest(Msg):
    """``loki.projects.delete``: delete a project with its pages and trackers; ``confirm``
    must repeat ``project_id``. If it was active, the default project becomes active. The
    project's conversations and archived blocks are deleted by the caller (the gateway asks
    the chat and recall services) — the ``deleted`` change event tells the others."""

    project_id: str
    confirm: str


class ProjectDeleteReply(Reply):
    """What was deleted: the project id and how many pages and trackers it held."""

    project_id: str = ""
    pages: int = 0
    trackers: int = 0


class ActiveProjectRequest(Msg):
    """``loki.projects.active``: the active project."""


class ActivateProjectRequest(Msg):
    """``loki.projects.activate``: make ``project_id`` the active project."""

    project_id: str


class ProjectBlockRequest(Msg):
    """``loki.projects.block``: the block of ``project_id`` (None: the active project)."""

    project_id: str | None = None


class ProjectBlockReply(Reply):
    """The block (None only with an error)."""

    block: ProjectBlock | None = None


# --- pages -------------------------------------------------------------------------------
class PageReadRequest(Msg):
    """``loki.projects.page.read``: ``page`` is a file (``notes.md``) or a name (``notes``)."""

    project_id: str
    page: str


class PageWriteRequest(Msg):
    """``loki.projects.page.write``: create or replace a page's whole ``content`` (at most
    256 KiB of UTF-8). ``description`` None keeps the page's description (empty for a new
    page)."""

    project_id: str
    page: str
    content: str
    description: str | None = None


class PageReply(Reply):
    """The page read or written; ``created`` is True when a write made a new page."""

    page: Page | None = None
    created: bool = False


class PageDeleteRequest(Msg):
    """``loki.projects.page.delete``."""

    project_id: str
    page: str


class PageDeleteReply(Reply):
    """The file deleted."""

    file: str = ""


class PageListRequest(Msg):
    """``loki.projects.page.list``: every page's metadata and the index text."""

    project_id: str


class PagesReply(Reply):
    """Pages sorted by file, and ``index``: the text of ``MEMORY.md`` (the index lines of
    :class:`ProjectBlock`, one per line, ending with a newline; empty when no page)."""

    pages: list[PageMeta] = Field(default_factory=list)
    index: str = ""


class PageSearchRequest(Msg):
    """``loki.projects.page.search``: pages matching ``query`` (words; at most ``limit``
    hits, 1-50)."""

    project_id: str
    query: str
    limit: int = 10


class SearchReply(Reply):
    """Hits, best first (empty: nothing matches)."""

    hits: list[SearchHit] = Field(default_factory=list)


# --- trackers ----------------------------------------------------------------------------
class TrackerLogRequest(Msg):
    """``loki.projects.tracker.log``: add a value to ``tracker`` (a name or slug; created on
    first use). ``unit``: None keeps the tracker's unit (empty for a new one); given for an
    existing tracker it must match (else ``invalid_request``). ``date``: ``YYYY-MM-DD``,
    None is today (UTC)."""

    project_id: str
    tracker: str
    value: float
    unit: str | None = None
    date: str | None = None
    note: str = ""


class TrackerLogReply(Reply):
    """The tracker after the log, the value stored, and whether the tracker was created."""

    tracker: Tracker | None = None
    value: TrackerValue | None = None
    created: bool = False


class TrackerReadRequest(Msg):
    """``loki.projects.tracker.read``: one level of a tracker, never all its values at once.

    Levels: ``overview`` (one :class:`TrackerPeriod` per year; ``period`` ignored), ``year``
    (``period`` ``YYYY``: one per month), ``month`` (``period`` ``YYYY-MM``: one per day),
    ``events`` (``period`` ``YYYY-MM`` or ``YYYY-MM-DD``: the values themselves, at most
    ``limit``, the latest kept). ``year``/``month``/``events`` without a period read the
    period of the latest value."""

    project_id: str
    tracker: str
    level: TrackerLevel = "overview"
    period: str | None = None
    limit: int = 100


class TrackerReadReply(Reply):
    """``periods`` (overview, year, month) or ``events`` (events; ``more`` values of the
    period were left out), and ``text``: the same as lines for the model."""

    tracker: Tracker | None = None
    level: TrackerLevel = "overview"
    period: str | None = None
    periods: list[TrackerPeriod] = Field(default_factory=list)
    events: list[TrackerValue] = Field(default_factory=list)
    more: int = 0
    text: str = ""


class TrackerListRequest(Msg):
    """``loki.projects.tracker.list``: the project's trackers."""

    project_id: str


class TrackersReply(Reply):
    """Trackers sorted by slug."""

    trackers: list[Tracker] = Field(default_factory=list)


class TrackerDeleteRequest(Msg):
    """``loki.projects.tracker.delete``: delete a tracker and its values."""

    project_id: str
    tracker: str


class TrackerDeleteReply(Reply):
    """The slug deleted."""

    slug: str = ""


# --- export / import ---------------------------------------------------------------------
class ExportRequest(Msg):
    """``loki.projects.export``: the project as a zip."""

    project_id: str


class ExportReply(Reply):
    """``zip_b64``: base64 of a zip holding ``project.json`` (name, description,
    instructions), ``pages/<file>`` (Markdown; ``pages/MEMORY.md`` the index, for reading)
    and ``trackers/<slug>.csv`` (header ``date,value,unit,note``). ``filename`` suggests a
    name for the download."""

    filename: str = ""
    zip_b64: str = ""


class ImportRequest(Msg):
    """``loki.projects.import``: a new project from a zip made by ``export``; ``name`` None
    takes the exported name (made unique like a create)."""

    zip_b64: str
    name: str | None = None


# --- the event ---------------------------------------------------------------------------
class ProjectChangedEvent(Msg):
    """``loki.projects.changed`` (published by the memory service after every change):
    ``kind`` says what changed, ``key`` which page file or tracker slug (None for the
    others), ``ts`` when."""

    project_id: str
    kind: ChangeKind
    key: str | None = None
    ts: float = 0.0
