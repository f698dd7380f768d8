"""Memory pages over NATS: write / read / list / delete, the MEMORY.md index kept by code,
search, and the errors a bad page gets."""

from __future__ import annotations

import pytest

from loki_shared import errors
from loki_shared.projects_client import ProjectsClient


async def test_pages_and_the_index_kept_by_code(client: ProjectsClient) -> None:
    first = await client.write_page("default", "Diet notes", "# Diet\nno sugar", "what I eat")
    assert first.created and first.page is not None
    assert (first.page.file, first.page.title, first.page.description) == (
        "diet-notes.md",
        "Diet",
        "what I eat",
    )
    await client.write_page("default", "aaa.md", "no heading here")
    listed = await client.list_pages("default")
    assert [p.file for p in listed.pages] == ["aaa.md", "diet-notes.md"]
    assert listed.index == "- [aaa](aaa.md)\n- [Diet](diet-notes.md) — what I eat\n"

    # a rewrite without a description keeps it; the title follows the new heading
    again = await client.write_page("default", "diet-notes", "# Food\nless sugar")
    assert not again.created and again.page is not None
    assert (again.page.title, again.page.description) == ("Food", "what I eat")
    page = await client.read_page("default", "diet-notes.md")
    assert page.content == "# Food\nless sugar"
    # a multi-line description becomes one line
    await client.write_page("default", "aaa", "text", "line one\n  line two")
    index = (await client.list_pages("default")).index
    assert index == "- [aaa](aaa.md) — line one line two\n- [Food](diet-notes.md) — what I eat\n"
    # MEMORY.md reads as the index and cannot be written or deleted
    assert (await client.read_page("default", "MEMORY.md")).content == index
    with pytest.raises(errors.InvalidRequest, match="index"):
        await client.write_page("default", "MEMORY.md", "- [x](x.md)")
    with pytest.raises(errors.InvalidRequest, match="index"):
        await client.delete_page("default", "memory")

    assert await client.delete_page("default", "aaa") == "aaa.md"
    assert (await client.list_pages("default")).index == "- [Food](diet-notes.md) — what I eat\n"
    with pytest.raises(errors.NotFound):
        await client.read_page("default", "aaa")
    with pytest.raises(errors.NotFound):
        await client.delete_page("default", "aaa")


async def test_bad_pages_get_clear_errors(client: ProjectsClient) -> None:
    with pytest.raises(errors.NotFound, match="project"):
        await client.write_page("nope", "x", "y")
    with pytest.raises(errors.InvalidRequest, match="no file name"):
        await client.write_page("default", "???", "y")
    with pytest.raises(errors.InvalidRequest, match="split the page"):
        await client.write_page("default", "big", "x" * (256 * 1024 + 1))
    with pytest.raises(errors.InvalidRequest, match="one line of at most 300"):
        await client.write_page("default", "x", "y", "d" * 301)
    assert (await client.list_pages("default")).pages == []


async def test_search_ranks_title_description_and_text(client: ProjectsClient) -> None:
    await client.write_page(
        "default", "bike", "# Bike\nbike chain oiled on monday\nnew tyres", "wheels"
    )
    await client.write_page("default", "car", "# Car\nthe bike rack is in the garage")
    await client.write_page("default", "misc", "nothing to see")
    hits = await client.search_pages("default", "Bike chain")
    assert [h.file for h in hits] == ["bike.md", "car.md"]
    assert hits[0].score > hits[1].score
    assert hits[0].snippet == "bike chain oiled on monday"  # the line with most words
    assert hits[1].snippet == "the bike rack is in the garage"
    assert len(await client.search_pages("default", "bike", limit=1)) == 1
    assert await client.search_pages("default", "submarine") == []
    with pytest.raises(errors.InvalidRequest, match="no word"):
        await client.search_pages("default", "  ?! ")
    with pytest.raises(errors.InvalidRequest, match="limit"):
        await client.search_pages("default", "bike", limit=0)
