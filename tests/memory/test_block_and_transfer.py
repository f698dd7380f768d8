"""The project block (what the chat side puts at the head of a conversation), and export →
import round-tripping a project."""

from __future__ import annotations

import base64
import io
import json
import os
import zipfile

import pytest
from nats.aio.client import Client as NATS

from loki_shared import errors
from loki_shared.projects_client import ProjectsClient


async def test_block_holds_description_index_latest_values_and_instructions(
    client: ProjectsClient,
) -> None:
    empty = await client.block()  # the active project: the default one
    assert (empty.project_id, empty.description, empty.index, empty.trackers) == (
        "default",
        "",
        [],
        {},
    )
    await client.create_project("Fitness", description="Run a marathon", instructions="Metric.")
    await client.write_page("fitness", "plan", "# Training plan\n3 runs a week", "the weekly plan")
    await client.log_value("fitness", "Weight", 72.0, unit="kg", date="2026-03-01")
    await client.log_value("fitness", "Weight", 71.5, date="2026-03-08", note="after a long run")
    await client.log_value("fitness", "Runs", 3, date="2026-03-08")
    await client.activate_project("fitness")
    block = await client.block()
    assert block.project_id == "fitness" and block.name == "Fitness"
    assert (block.description, block.instructions) == ("Run a marathon", "Metric.")
    assert block.index == ["- [Training plan](plan.md) — the weekly plan"]
    assert block.trackers == {
        "runs": "- Runs: 3 (2026-03-08)",
        "weight": "- Weight: 71.5 kg (2026-03-08) — after a long run",
    }
    # as_of moves with every change
    await client.write_page("fitness", "shoes", "size 43")
    later = await client.block("fitness")
    assert later.as_of > block.as_of
    assert later.index[1] == "- [shoes](shoes.md)"
    with pytest.raises(errors.NotFound):
        await client.block("nope")


async def test_export_then_import_round_trips_a_project(client: ProjectsClient) -> None:
    await client.create_project("Garden", description="Veg patch", instructions="Use metric")
    await client.write_page("garden", "beds", "# Beds\ncarrots, leeks", "what grows where")
    await client.write_page("garden", "Tools", "spade")
    for date, value, note in [
        ("2026-05-02", 4.0, "storm"),
        ("2026-05-01", 3.5, ""),
        ("2026-05-02", 1.0, ""),
    ]:
        await client.log_value("garden", "Rain", value, unit="mm", date=date, note=note)
    await client.log_value("garden", "Harvest", 2.25, unit="kg", date="2026-07-01")

    exported = await client.export_project("garden")
    assert exported.filename == "garden.zip"
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(exported.zip_b64))) as zf:
        assert sorted(zf.namelist()) == [
            "pages/MEMORY.md",
            "pages/beds.md",
            "pages/tools.md",
            "project.json",
            "trackers/harvest.csv",
            "trackers/rain.csv",
        ]
        assert zf.read("trackers/rain.csv").decode() == (
            "date,value,unit,note\n2026-05-01,3.5,mm,\n2026-05-02,4.0,mm,storm\n2026-05-02,1.0,mm,\n"
        )
        assert json.loads(zf.read("project.json"))["pages"] == {
            "beds.md": "what grows where",
            "tools.md": "",
        }

    # beside a project of the same name: imported as "Garden (imported)", never a second
    # "Garden" (issue 41)
    imported = await client.import_project(exported.zip_b64)
    assert (imported.id, imported.name) == ("garden-imported", "Garden (imported)")
    assert (imported.description, imported.instructions) == ("Veg patch", "Use metric")
    for kind in ("pages", "trackers"):
        a = await _dump(client, "garden", kind)
        b = await _dump(client, "garden-imported", kind)
        assert a == b and a, kind
    one, two = await client.block("garden"), await client.block("garden-imported")
    assert (one.index, one.trackers) == (two.index, two.trackers)
    renamed = await client.import_project(exported.zip_b64, name="Allotment")
    assert (renamed.id, renamed.name) == ("allotment", "Allotment")
    again = await client.import_project(exported.zip_b64)
    assert (again.id, again.name) == ("garden-imported-2", "Garden (imported 2)")
    names = [p.name.casefold() for p in (await client.list_projects()).projects]
    assert len(names) == len(set(names))


async def _dump(client: ProjectsClient, pid: str, kind: str) -> list[object]:
    if kind == "pages":
        return [
            (p.file, p.title, p.description, (await client.read_page(pid, p.file)).content)
            for p in (await client.list_pages(pid)).pages
        ]
    out: list[object] = []
    for t in await client.list_trackers(pid):
        events = await client.read_tracker(pid, t.slug, "events", "2026-05")
        out.append((t.slug, t.name, t.unit, t.count, [e.model_dump() for e in events.events]))
    return out


def _zip(files: dict[str, str]) -> str:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return base64.b64encode(buf.getvalue()).decode()


async def test_import_refuses_what_is_not_an_export(client: ProjectsClient) -> None:
    manifest = json.dumps(
        {"format": "loki-project", "version": 1, "name": "X", "trackers": {"t": {}}}
    )
    for zip_b64, match in [
        ("%%%", "not base64"),
        (base64.b64encode(b"plain text").decode(), "not a zip"),
        (_zip({"readme.txt": "hi"}), "project.json"),
        (_zip({"project.json": '{"format": "other"}'}), "format"),
        (
            _zip({"project.json": manifest, "trackers/t.csv": "date,value\n2026-13-01,1\n"}),
            "YYYY-MM-DD",
        ),
        (
            _zip({"project.json": manifest, "trackers/t.csv": "date,value\n2026-01-01,abc\n"}),
            "no number",
        ),
    ]:
        with pytest.raises(errors.InvalidRequest, match=match):
            await client.import_project(zip_b64)
    # nothing half-imported
    assert [p.id for p in (await client.list_projects()).projects] == ["default"]
    with pytest.raises(errors.NotFound):
        await client.export_project("nope")


def _broken_member_zips() -> list[str]:
    """Zips whose member cannot be read: deflated data broken, a compression method zipfile
    does not know, the member marked encrypted."""
    manifest = json.dumps({"format": "loki-project", "version": 1, "name": "X"})
    out = []
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("project.json", manifest)
        zf.writestr("pages/notes.md", "# Notes\n" + "some text " * 200)
    raw = bytearray(buf.getvalue())
    at = raw.index(b"pages/notes.md") + len("pages/notes.md") + 20  # inside its data
    raw[at : at + 16] = b"\xff" * 16
    out.append(base64.b64encode(bytes(raw)).decode())
    for offset, value in ((8, 99), (6, 1)):  # compression method 99 (AES); the encrypted flag
        raw = bytearray(buf.getvalue())
        local = raw.index(b"PK\x03\x04", raw.index(b"PK\x03\x04") + 4)  # the page's header
        central = raw.index(b"PK\x01\x02", raw.index(b"PK\x01\x02") + 4)
        raw[local + offset] = value
        raw[central + offset + 2] = value
        out.append(base64.b64encode(bytes(raw)).decode())
    return out


async def test_import_refuses_an_unreadable_zip_without_a_500(client: ProjectsClient) -> None:
    """Issue 38 §7: any failure of the unzipper or a manifest of the wrong shape is an
    ``invalid_request`` saying what is wrong, and nothing is imported."""
    for zip_b64 in _broken_member_zips():
        with pytest.raises(errors.InvalidRequest, match="zip|Error"):
            await client.import_project(zip_b64)
    for field in ("pages", "trackers"):
        manifest = json.dumps({"format": "loki-project", "version": 1, field: ["x"]})
        with pytest.raises(errors.InvalidRequest, match=f"'{field}' is not an object"):
            await client.import_project(_zip({"project.json": manifest}))
    assert [p.id for p in (await client.list_projects()).projects] == ["default"]


async def test_an_export_too_big_for_the_bus_is_refused_not_lost(
    client: ProjectsClient, nc: NATS
) -> None:
    """A zip over NATS max_payload (the server's; the suite's server takes 32 MiB for images)
    would be a reply never delivered: the caller gets ``conflict`` saying so at once, not a
    timeout."""
    await client.create_project("Big")
    # incompressible text (~253 kB of base64 a page, under the page cap): the zip's base64
    # outgrows max_payload by a few pages
    n = nc.max_payload // 253_000 + 4
    for i in range(n):
        page = base64.b64encode(os.urandom(190_000)).decode()
        await client.write_page("big", f"p{i}", page)
    with pytest.raises(errors.Conflict, match="max_payload"):
        await client.export_project("big", timeout=60)
    for i in range(3, n):
        await client.delete_page("big", f"p{i}")
    assert (await client.export_project("big", timeout=60)).zip_b64


async def test_a_request_too_big_for_the_bus_is_an_invalid_request(
    client: ProjectsClient, nc: NATS
) -> None:
    too_big = base64.b64encode(os.urandom(nc.max_payload * 9 // 10)).decode()
    with pytest.raises(errors.InvalidRequest, match="max_payload"):
        await client.import_project(too_big)
    assert [p.id for p in (await client.list_projects()).projects] == ["default"]
