"""The chat service's link to the memory service (``loki.projects.*``, through
:class:`loki_shared.projects_client.ProjectsClient`): the project block for
:class:`~loki_chat.project.head.ProjectHead` and the calls of the memory tools
(:mod:`loki_chat.tools.memory`).

Rules:

- The block: :func:`block_view` maps the contract's ``ProjectBlock`` (index lines, tracker
  lines by slug, already rendered by the memory service) to a :class:`~.block.BlockView`.
  A locked memory or an unknown project: no block (None); no memory service: raised, so
  the head logs it and goes on without (key off) or keeps its copy (key on).
- The tools: a refusal of the service (``not_found``, ``invalid_request`` — its message says
  what to resend —, ``locked``, ``conflict``) becomes :class:`~loki_chat.tools.memory.
  MemoryRefused` (the model reads its message); ``unavailable`` is re-raised (the tool's
  "unreachable" result).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from loki_shared.errors import Locked, LokiError, NotFound, Unavailable
from loki_shared.messages.projects import ProjectBlock
from loki_shared.projects_client import ProjectsClient

from ..tools.memory import MemoryCall, MemoryRefused
from .block import BlockView, TrackerLine
from .head import BlockFetch


def block_view(block: ProjectBlock) -> BlockView:
    """The contract's block in the chat service's terms (index lines joined by newlines,
    trackers in the service's order: by slug)."""
    return BlockView(
        project=block.project_id,
        name=block.name,
        description=block.description,
        index="\n".join(block.index),
        trackers=tuple(TrackerLine(slug=slug, text=line) for slug, line in block.trackers.items()),
        instructions=block.instructions,
    )


def block_fetch(client: ProjectsClient) -> BlockFetch:
    """``fetch(project)`` for :class:`~.head.ProjectHead` (see the module rules)."""

    async def fetch(project: str) -> BlockView | None:
        try:
            return block_view(await client.block(project))
        except (Locked, NotFound):
            return None

    return fetch


def active_project_id(client: ProjectsClient) -> Callable[[], Awaitable[str]]:
    """``active()`` for :class:`~.head.ProjectHead`: the id of the active project."""

    async def active() -> str:
        return (await client.active_project()).id

    return active


def _format_hits(hits: list[Any]) -> str:
    if not hits:
        return "No page matches."
    lines = []
    for hit in hits:
        desc = f" — {hit.description}" if hit.description else ""
        lines.append(f"- [{hit.title}]({hit.file}){desc}\n  {hit.snippet}".rstrip())
    return "\n".join(lines)


def memory_call(client: ProjectsClient) -> MemoryCall:
    """``call(tool, arguments, project)`` for :func:`~loki_chat.tools.memory.memory_tools`:
    one request per tool; the result as text for the model."""

    async def call(tool: str, args: dict[str, Any], project: str) -> str:
        try:
            if tool == "memory_read":
                page = await client.read_page(project, args["page"])
                return page.content
            if tool == "memory_write":
                reply = await client.write_page(
                    project, args["page"], args["content"], args["description"]
                )
                file = reply.page.file if reply.page else args["page"]
                verb = "created" if reply.created else "replaced"
                return f"Page {file} {verb}; the memory index lists it."
            if tool == "memory_search":
                return _format_hits(await client.search_pages(project, args["query"]))
            if tool == "tracker_log":
                logged = await client.log_value(
                    project,
                    args["tracker"],
                    args["value"],
                    unit=args.get("unit"),
                    date=args.get("date"),
                    note=args.get("note", ""),
                )
                t, v = logged.tracker, logged.value
                if t is None or v is None:
                    return "Logged."
                unit = f" {t.unit}" if t.unit else ""
                made = " (new tracker)" if logged.created else ""
                return f"Logged {t.name}: {v.value:g}{unit} on {v.date}{made}."
            if tool == "tracker_read":
                read = await client.read_tracker(
                    project,
                    args["tracker"],
                    level=args.get("level", "overview"),
                    period=args.get("period"),
                )
                return read.text or "No value in this period."
        except Unavailable:
            raise
        except LokiError as exc:
            raise MemoryRefused(str(exc)) from exc
        raise MemoryRefused(f"unknown memory tool {tool}")

    return call
