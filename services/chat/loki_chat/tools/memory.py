"""The project memory tools: ``memory_read``, ``memory_write``, ``memory_search``,
``tracker_log``, ``tracker_read`` (issue 18; served by the memory service).

Rules:

- Offered in :func:`~loki_chat.tools.default_toolbox` after the recall tools, in this fixed
  order; like every tool, withheld from a model whose chat template drops tools (the
  probe's ``supports_tools``: :meth:`~loki_chat.turn.TurnRunner.offered_tools`).
- Arguments are checked here (pydantic models, unknown fields refused) before anything is
  sent: a bad call is not forwarded and its result says exactly what to resend (which
  argument, what was wrong, an example call).
- Each call carries the conversation's project; the memory service's refusal (a locked
  memory, an unknown page or tracker) is the result, prefixed ``Error:``; the service
  unreachable: the result says so and invites a retry. Results over the tool cap are cut by
  the turn loop like any other (:func:`~loki_chat.tools.box.cut_for_model`).
"""

from __future__ import annotations

import json
import logging
import re
import unicodedata
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .box import ToolFn, ToolSpec

log = logging.getLogger("loki.chat.tools")

UNREACHABLE = (
    "The project memory (memory service) is unreachable right now; nothing was read or "
    "written. Try the call again in a moment."
)

#: A page file name: a letter or digit of any script first, then letters, digits, combining
#: marks, ``.``, ``-``, ``_`` (at most 100 before ``.md``); white space, separators and
#: control characters never (the memory service derives the stored file from it).
PAGE_STEM_MAX = 100
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
PERIOD = re.compile(r"^\d{4}(-\d{2})?$")

#: ``call(tool, arguments, project) -> result text``; raises :class:`MemoryRefused` for the
#: service's refusal (its message is the model's), anything else for "unreachable".
MemoryCall = Callable[[str, dict[str, Any], str], Awaitable[str]]


#: The project of the conversation whose turn runs in this task (set by the turn loop:
#: :meth:`~loki_chat.turn.TurnRunner.begin`); the tools send it with every call.
CURRENT_PROJECT: ContextVar[str] = ContextVar("loki_current_project", default="default")


class MemoryRefused(Exception):
    """The memory service refused the call (locked memory, unknown page...): its message
    is what the model reads."""


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


def is_page_name(value: str) -> bool:
    """Whether ``value`` is a page file name the memory tools take (``notes.md``,
    ``日記.md``, ``हिन्दी.md``; see :data:`PAGE_STEM_MAX`)."""
    value = unicodedata.normalize("NFC", value)
    if not value.endswith(".md"):
        return False
    stem = value[:-3]
    if not 1 <= len(stem) <= PAGE_STEM_MAX or unicodedata.category(stem[0])[0] not in "LN":
        return False
    return all(unicodedata.category(ch)[0] in "LNM" or ch in "._-" for ch in stem)


def _page(value: str) -> str:
    if not is_page_name(value):
        raise ValueError(
            "a page file name like `notes.md` or `日記.md` (letters or digits of any script, "
            "`.`, `-`, `_`)"
        )
    if value.upper() == "MEMORY.MD":
        raise ValueError("MEMORY.md is the index, kept by Loki: name another page")
    return value


class MemoryReadArgs(_Args):
    page: str = Field(min_length=1)

    @field_validator("page")
    @classmethod
    def _page_name(cls, v: str) -> str:
        return _page(v)


class MemoryWriteArgs(MemoryReadArgs):
    content: str = Field(min_length=1)
    description: str = Field(min_length=1, max_length=200)


class MemorySearchArgs(_Args):
    query: str = Field(min_length=1)


class TrackerLogArgs(_Args):
    tracker: str = Field(min_length=1, max_length=60)
    value: float
    unit: str | None = Field(default=None, max_length=20)
    date: str | None = None
    note: str | None = Field(default=None, max_length=500)

    @field_validator("date")
    @classmethod
    def _date(cls, v: str | None) -> str | None:
        if v is not None and not DATE.match(v):
            raise ValueError("a date as YYYY-MM-DD")
        return v


class TrackerReadArgs(_Args):
    tracker: str = Field(min_length=1, max_length=60)
    level: Literal["overview", "year", "month", "events"] | None = None
    period: str | None = None

    @field_validator("period")
    @classmethod
    def _period(cls, v: str | None) -> str | None:
        if v is not None and not PERIOD.match(v):
            raise ValueError("a year (YYYY) or a month (YYYY-MM)")
        return v


EXAMPLES: dict[str, dict[str, Any]] = {
    "memory_read": {"page": "notes.md"},
    "memory_write": {"page": "notes.md", "content": "# Notes\n...", "description": "what it holds"},
    "memory_search": {"query": "keywords"},
    "tracker_log": {"tracker": "weight", "value": 81.2, "unit": "kg", "date": "2026-12-01"},
    "tracker_read": {"tracker": "weight", "level": "month", "period": "2026-11"},
}

MODELS: dict[str, type[_Args]] = {
    "memory_read": MemoryReadArgs,
    "memory_write": MemoryWriteArgs,
    "memory_search": MemorySearchArgs,
    "tracker_log": TrackerLogArgs,
    "tracker_read": TrackerReadArgs,
}


def check_arguments(tool: str, args: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """Validate ``args`` for ``tool``. Returns (the clean arguments, "") or (None, the
    result telling the model exactly what to resend)."""
    try:
        clean = MODELS[tool].model_validate(args)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "arguments"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "missing":
                msg = "missing (required)"
            elif err["type"] == "extra_forbidden":
                msg = "not an argument of this tool"
            problems.append(f"`{where}`: {msg}")
        example = json.dumps(EXAMPLES[tool], ensure_ascii=False)
        return None, (
            f"Error: the call to `{tool}` was NOT executed: " + "; ".join(problems) + ". "
            f"Send it again with these arguments fixed, for example {example}."
        )
    return clean.model_dump(exclude_none=True), ""


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required}


STR = {"type": "string"}


def memory_tools(call: MemoryCall) -> list[ToolSpec]:
    """The five tools, in their fixed order. ``call`` reaches the memory service with the
    project of the conversation the call comes from (:data:`CURRENT_PROJECT`)."""

    def make(name: str) -> ToolFn:
        async def run(args: dict[str, Any]) -> str:
            clean, error = check_arguments(name, args)
            if clean is None:
                return error
            try:
                return await call(name, clean, CURRENT_PROJECT.get())
            except MemoryRefused as exc:
                return f"Error: {exc}"
            except Exception as exc:  # noqa: BLE001 - unreachable for any reason
                log.warning("memory tool %s unreachable: %r", name, exc)
                return UNREACHABLE

        return run

    page = {"type": "string", "description": "the page's file name, e.g. notes.md"}
    return [
        ToolSpec(
            name="memory_read",
            description="Read one page of the project's memory (listed in the memory index).",
            parameters=_schema({"page": page}, ["page"]),
            run=make("memory_read"),
        ),
        ToolSpec(
            name="memory_write",
            description=(
                "Create or replace a page of the project's memory; the index line is kept "
                "by Loki from the description."
            ),
            parameters=_schema(
                {
                    "page": page,
                    "content": {"type": "string", "description": "the whole page, Markdown"},
                    "description": {"type": "string", "description": "one line for the index"},
                },
                ["page", "content", "description"],
            ),
            run=make("memory_write"),
        ),
        ToolSpec(
            name="memory_search",
            description="Find pages of the project's memory by keywords.",
            parameters=_schema({"query": {"type": "string", "description": "keywords"}}, ["query"]),
            run=make("memory_search"),
        ),
        ToolSpec(
            name="tracker_log",
            description="Log a dated value in a tracker of the project (created if new).",
            parameters=_schema(
                {
                    "tracker": {"type": "string", "description": "the tracker, e.g. weight"},
                    "value": {"type": "number"},
                    "unit": {"type": "string", "description": "e.g. kg (a new tracker's unit)"},
                    "date": {"type": "string", "description": "YYYY-MM-DD (default: today)"},
                    "note": STR,
                },
                ["tracker", "value"],
            ),
            run=make("tracker_log"),
        ),
        ToolSpec(
            name="tracker_read",
            description=(
                "Read a tracker by levels: overview, then a year, a month, the events "
                "(never the whole series at once)."
            ),
            parameters=_schema(
                {
                    "tracker": {"type": "string"},
                    "level": {"type": "string", "enum": ["overview", "year", "month", "events"]},
                    "period": {"type": "string", "description": "YYYY or YYYY-MM"},
                },
                ["tracker"],
            ),
            run=make("tracker_read"),
        ),
    ]
