"""Export a project as a zip, and import one as a new project.

The zip holds ``project.json`` (``{"format": "loki-project", "version": 1, "name",
"description", "instructions", "pages": {file: description}, "trackers": {slug: {"name",
"unit"}}}``), ``pages/<file>`` (each page's Markdown), ``pages/MEMORY.md`` (the index, for a
person; rebuilt on import) and ``trackers/<slug>.csv`` (header ``date,value,unit,note``, the
values by date, in the order logged within a date).
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
import zipfile
from typing import Any

from loki_shared.errors import InvalidRequest
from loki_shared.messages.projects import Project

from . import index, levels, names
from . import trackers as trackers_mod
from .pages import CONTENT_MAX
from .store import Store

FORMAT = "loki-project"
#: Largest zip accepted (bytes, decoded) and largest total of its files once unpacked.
ZIP_MAX = 32 * 1024 * 1024
UNPACKED_MAX = 64 * 1024 * 1024
CSV_HEADER = ["date", "value", "unit", "note"]


async def export(store: Store, project_id: str) -> tuple[str, bytes]:
    """``(filename, zip bytes)`` of ``project_id``.

    Raises:
        NotFound: no such project.
        Locked: the memory is locked.
    """
    project = await store.projects.get(project_id)
    body = await store.projects.body(project_id)
    pages = await store.pages.all(project_id)
    trackers = await store.trackers.all(project_id)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": 1,
        "name": project.name,
        "description": body["description"],
        "instructions": body["instructions"],
        "pages": {p.file: p.description for p in pages},
        "trackers": {t.slug: {"name": t.name, "unit": t.unit} for t in trackers},
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("project.json", json.dumps(manifest, ensure_ascii=False, indent=2))
        for page in pages:
            zf.writestr(f"pages/{page.file}", page.content)
        zf.writestr(f"pages/{names.INDEX_FILE}", index.text(pages))
        for tracker in trackers:
            _, values = await store.trackers.series(project_id, tracker.slug)
            out = io.StringIO()
            writer = csv.writer(out, lineterminator="\n")
            writer.writerow(CSV_HEADER)
            for v in levels.ordered(values):
                writer.writerow([v.date, repr(v.value), tracker.unit, v.note])
            zf.writestr(f"trackers/{tracker.slug}.csv", out.getvalue())
    return f"{project.id}.zip", buf.getvalue()


def _unpack(zip_b64: str) -> dict[str, bytes]:
    """The files of the zip in ``zip_b64``.

    Raises:
        InvalidRequest: not base64, not a zip, or too big.
    """
    try:
        raw = base64.b64decode(zip_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest("zip_b64 is not base64: resend the export's zip_b64") from exc
    if len(raw) > ZIP_MAX:
        raise InvalidRequest(f"the zip is over {ZIP_MAX} bytes")
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir()]
            if sum(i.file_size for i in infos) > UNPACKED_MAX:
                raise InvalidRequest(f"the zip unpacks to over {UNPACKED_MAX} bytes")
            return {i.filename: zf.read(i) for i in infos}
    except InvalidRequest:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        raise InvalidRequest("zip_b64 is not a zip: resend a zip made by export") from exc
    except Exception as exc:  # zipfile fails on a broken member in many ways: each is invalid
        # a member compressed by a method zipfile lacks, encrypted, or whose data is broken
        raise InvalidRequest(
            f"the zip cannot be read ({type(exc).__name__}: {exc}): resend a zip made by export"
        ) from exc


def _manifest(files: dict[str, bytes]) -> dict[str, Any]:
    try:
        manifest = json.loads(files["project.json"])
    except (KeyError, ValueError) as exc:
        raise InvalidRequest("the zip has no readable project.json: not a Loki export") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InvalidRequest(f"project.json is not of format {FORMAT!r}: not a Loki export")
    for field in ("pages", "trackers"):
        if not isinstance(manifest.get(field) or {}, dict):
            raise InvalidRequest(f"project.json's {field!r} is not an object: not a Loki export")
    return manifest


def _rows(slug: str, data: bytes) -> list[dict[str, str]]:
    try:
        rows = list(csv.DictReader(io.StringIO(data.decode("utf-8"))))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InvalidRequest(f"trackers/{slug}.csv is not UTF-8 CSV") from exc
    if rows and not {"date", "value"} <= set(rows[0]):
        raise InvalidRequest(f"trackers/{slug}.csv lacks the date and value columns")
    return rows


IMPORTED = " (imported)"


async def _free_name(store: Store, exported: str) -> str:
    """The exported name, or, when a project already has it (case and spacing aside),
    ``"<name> (imported)"`` (then ``"(imported 2)"``, ``"(imported 3)"``...), cut to fit the
    80 characters a name may have: an import never puts two projects of one name side by
    side in the switcher."""
    taken = {" ".join(p.name.split()).casefold() for p in await store.projects.all()}
    base = " ".join(exported.split())
    candidate, n = base, 1
    while candidate.casefold() in taken:
        suffix = IMPORTED if n == 1 else f" (imported {n})"
        candidate = base[: names.NAME_MAX - len(suffix)].rstrip() + suffix
        n += 1
    return candidate


async def import_(store: Store, zip_b64: str, name: str | None) -> Project:
    """A new project from an export; ``name`` None takes the exported name, as
    ``"<name> (imported)"`` when a project has that name already (:func:`_free_name`; the id
    is derived from the name, ``-2``, ``-3``... when taken).
    Everything is checked before the project is created.

    Raises:
        InvalidRequest: not an export, or a page, value or date in it that is not valid.
        Locked: the memory is locked.
    """
    files = _unpack(zip_b64)
    manifest = _manifest(files)
    await store.vault.require_open()
    pages: list[tuple[str, str, str]] = []
    descriptions = manifest.get("pages") or {}
    for path, data in sorted(files.items()):
        if not path.startswith("pages/") or path == f"pages/{names.INDEX_FILE}":
            continue
        file = names.page_file(path[len("pages/") :])
        try:
            content = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequest(f"{path} is not UTF-8 text") from exc
        if len(data) > CONTENT_MAX:
            raise InvalidRequest(f"{path} is over {CONTENT_MAX} bytes")
        pages.append((file, content, names.description(str(descriptions.get(file, "")))))
    trackers = []
    for slug, info in (manifest.get("trackers") or {}).items():
        entries = []
        for row in _rows(slug, files.get(f"trackers/{slug}.csv", b"")):
            try:
                number = float(row["value"])
            except (TypeError, ValueError) as exc:
                raise InvalidRequest(f"trackers/{slug}.csv: {row['value']!r} is no number") from exc
            entries.append(
                trackers_mod.value_of(row.get("date") or "", number, row.get("note") or "")
            )
        info = info if isinstance(info, dict) else {}
        trackers.append((str(info.get("name") or slug), str(info.get("unit") or ""), entries))
    if name is None:
        name = await _free_name(store, str(manifest.get("name") or "Imported"))
    project = await store.projects.create(
        name,
        str(manifest.get("description") or ""),
        str(manifest.get("instructions") or ""),
        None,
    )
    for file, content, description in pages:
        await store.pages.write(project.id, file, content, description)
    for tracker_name, unit, entries in trackers:
        await store.trackers.append(project.id, tracker_name, unit, entries)
    return await store.projects.get(project.id)
