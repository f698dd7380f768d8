"""Names in any script on the memory service (real NATS and Redis; issue 38 §4): a project,
a page and a tracker named in Cyrillic, Japanese, Arabic or Devanagari are created, listed
with the name as written, read back by that name; the path rules still refuse separators,
dots and the index; a page or tracker stored before Unicode slugs is still found."""

from __future__ import annotations

import pytest

from loki_shared import errors
from loki_shared.projects_client import ProjectsClient


async def test_a_project_named_in_another_script(client: ProjectsClient) -> None:
    made = await client.create_project("Здоровье", "Сон, вес, шаги.")
    assert made.name == "Здоровье" and made.id.startswith("p-")
    again = await client.create_project("Здоровье")  # the same name twice: the id is unique
    assert again.id == f"{made.id}-2" and again.name == "Здоровье"
    listed = {p.id: p.name for p in (await client.list_projects()).projects}
    assert listed[made.id] == "Здоровье"
    renamed = await client.update_project(made.id, name="हिन्दी नोट्स")
    assert renamed.name == "हिन्दी नोट्स"
    with pytest.raises(errors.InvalidRequest, match="holds no letter or digit"):
        await client.create_project("🙂 !!")


@pytest.mark.parametrize(
    ("page", "file"),
    [
        ("日記", "日記.md"),
        ("Здоровье", "здоровье.md"),
        ("مذكرات يومية", "مذكرات-يومية.md"),
        ("हिन्दी नोट्स", "हिन्दी-नोट्स.md"),
    ],
)
async def test_pages_named_in_any_script(client: ProjectsClient, page: str, file: str) -> None:
    made = await client.write_page("default", page, f"# {page}\ntext", f"about {page}")
    assert made.created and made.page is not None and made.page.file == file
    assert (await client.read_page("default", page)).content == f"# {page}\ntext"
    assert (await client.read_page("default", file)).title == page
    listed = await client.list_pages("default")
    assert [p.file for p in listed.pages] == [file]
    assert f"({file}) — about {page}" in listed.index
    hits = await client.search_pages("default", "text")
    assert [h.file for h in hits] == [file]
    assert await client.delete_page("default", page) == file


async def test_path_rules_stay_strict(client: ProjectsClient) -> None:
    for bad in ("../日記", "日記/../x", "..\\\\Здоровье"):
        made = await client.write_page("default", bad, "x")
        assert made.page is not None
        assert "/" not in made.page.file and "\\" not in made.page.file
        assert made.page.file.count(".") == 1  # only the one of ".md"
    for index in ("MEMORY.md", "ＭＥＭＯＲＹ"):
        with pytest.raises(errors.InvalidRequest, match="index"):
            await client.write_page("default", index, "x")
    with pytest.raises(errors.InvalidRequest, match="no file name"):
        await client.write_page("default", "🙂", "x")


async def test_a_tracker_named_in_another_script(client: ProjectsClient) -> None:
    logged = await client.log_value("default", "Вес", 81.5, "кг", "2026-11-02")
    assert logged.created and logged.tracker is not None
    assert (logged.tracker.slug, logged.tracker.name, logged.tracker.unit) == ("вес", "Вес", "кг")
    await client.log_value("default", "вес", 81.0, None, "2026-11-03")
    read = await client.read_tracker("default", "Вес", "events", "2026-11")
    assert [e.value for e in read.events] == [81.5, 81.0]
    assert [t.name for t in await client.list_trackers("default")] == ["Вес"]


async def test_pages_and_trackers_stored_before_unicode_slugs_are_found(
    client: ProjectsClient,
) -> None:
    """A name mixing Latin and another script had its other letters dropped: ``notes.md``
    for "Notes Здоровье". That page (and such a tracker) is read, rewritten and deleted by its
    name as before."""
    await client.write_page("default", "notes", "# old\nkept")  # the file the old slug gave
    await client.log_value("default", "weight", 80.0, "kg", "2026-01-01")
    assert (await client.read_page("default", "Notes Здоровье")).content == "# old\nkept"
    again = await client.write_page("default", "Notes Здоровье", "# new")
    assert not again.created and again.page is not None and again.page.file == "notes.md"
    logged = await client.log_value("default", "Weight Вес", 79.0, "kg", "2026-01-02")
    assert not logged.created and logged.tracker is not None and logged.tracker.slug == "weight"
    assert [p.file for p in (await client.list_pages("default")).pages] == ["notes.md"]
    assert await client.delete_page("default", "Notes Здоровье") == "notes.md"
    # a fresh one of such a name gets the whole name
    fresh = await client.write_page("default", "Notes Здоровье", "# fresh")
    assert fresh.created and fresh.page is not None and fresh.page.file == "notes-здоровье.md"
