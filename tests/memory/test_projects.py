"""Projects over NATS: the default project, create / rename / describe / activate / delete,
and the change events."""

from __future__ import annotations

import asyncio
import json

import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from redis.asyncio import Redis

from loki_memory.service import MemoryService
from loki_shared import errors, subjects
from loki_shared.messages.projects import DEFAULT_PROJECT
from loki_shared.projects_client import ProjectsClient


async def test_default_project_exists_and_is_active(client: ProjectsClient) -> None:
    listed = await client.list_projects()
    assert [p.id for p in listed.projects] == [DEFAULT_PROJECT]
    assert listed.active == DEFAULT_PROJECT
    active = await client.active_project()
    assert (active.id, active.name, active.locked) == (DEFAULT_PROJECT, "Default", False)


async def test_create_rename_describe_activate_and_list(client: ProjectsClient) -> None:
    diet = await client.create_project("Diet", description="Losing 5 kg", instructions="Be brief")
    assert (diet.id, diet.name, diet.description, diet.instructions) == (
        "diet",
        "Diet",
        "Losing 5 kg",
        "Be brief",
    )
    again = await client.create_project("diet!")  # same slug: made unique
    assert again.id == "diet-2"
    with pytest.raises(errors.Conflict):
        await client.create_project("Other", project_id="diet")
    with pytest.raises(errors.InvalidRequest, match="slug"):
        await client.create_project("Other", project_id="Not A Slug")
    with pytest.raises(errors.InvalidRequest, match="letter or digit"):
        await client.create_project("!!!")
    with pytest.raises(errors.InvalidRequest, match="1-80"):
        await client.create_project("x" * 81)

    renamed = await client.update_project("diet", name="Aardvark diet")
    assert (renamed.name, renamed.description) == ("Aardvark diet", "Losing 5 kg")
    assert renamed.updated_at >= diet.updated_at
    described = await client.update_project("diet", description="Losing 6 kg")
    assert (described.name, described.description, described.instructions) == (
        "Aardvark diet",
        "Losing 6 kg",
        "Be brief",
    )
    with pytest.raises(errors.NotFound):
        await client.update_project("nope", name="x")

    listed = await client.list_projects()
    assert [p.id for p in listed.projects] == [DEFAULT_PROJECT, "diet", "diet-2"]
    assert (await client.activate_project("diet")).id == "diet"
    assert (await client.active_project()).id == "diet"
    assert (await client.list_projects()).active == "diet"
    with pytest.raises(errors.NotFound):
        await client.activate_project("nope")


async def test_delete_takes_pages_and_trackers_and_needs_confirmation(
    client: ProjectsClient, redis: Redis
) -> None:
    await client.create_project("Garden")
    await client.write_page("garden", "Beds", "# Beds\ncarrots")
    await client.log_value("garden", "Rain", 3.5, unit="mm", date="2026-05-01")
    await client.activate_project("garden")
    with pytest.raises(errors.Conflict, match="confirm"):
        await client.delete_project("garden", confirm="yes")
    with pytest.raises(errors.Conflict, match="default"):
        await client.delete_project(DEFAULT_PROJECT, confirm=DEFAULT_PROJECT)
    with pytest.raises(errors.NotFound):
        await client.delete_project("nope", confirm="nope")
    assert await redis.keys("loki:projects:*garden*")  # pages, trackers, values

    reply = await client.delete_project("garden", confirm="garden")
    assert (reply.project_id, reply.pages, reply.trackers) == ("garden", 1, 1)
    assert await redis.keys("loki:projects:*garden*") == []
    assert not await redis.hexists("loki:projects:meta", "garden")
    assert (await client.active_project()).id == DEFAULT_PROJECT
    with pytest.raises(errors.NotFound):
        await client.read_page("garden", "beds")
    assert [p.id for p in (await client.list_projects()).projects] == [DEFAULT_PROJECT]


async def test_every_change_is_announced(client: ProjectsClient, nc: NATS) -> None:
    seen: list[dict[str, object]] = []

    async def on_event(msg: Msg) -> None:
        seen.append(json.loads(msg.data))

    sub = await nc.subscribe(subjects.PROJECTS_CHANGED, cb=on_event)
    await nc.flush()
    await client.create_project("Car")
    await client.update_project("car", description="the red one")
    await client.write_page("car", "Service", "oil changed")
    await client.log_value("car", "Mileage", 12000, unit="km")
    await client.delete_page("car", "service")
    await client.delete_project("car", confirm="car")
    for _ in range(50):
        if len(seen) >= 6:
            break
        await asyncio.sleep(0.05)
    await sub.unsubscribe()
    assert [(e["kind"], e["key"]) for e in seen] == [
        ("created", None),
        ("description", None),
        ("page", "service.md"),
        ("tracker", "mileage"),
        ("page", "service.md"),
        ("deleted", None),
    ]
    assert {e["project_id"] for e in seen} == {"car"}


async def test_malformed_requests_get_an_invalid_request_reply(
    memory: MemoryService, nc: NATS
) -> None:
    for subject, body in [
        (subjects.PROJECTS_CREATE, b"not json"),
        (subjects.PROJECTS_PAGE_WRITE, b'{"project_id": "default", "page": "x"}'),
        (subjects.PROJECTS_TRACKER_LOG, b'{"project_id": "default", "tracker": "w", "value": "a"}'),
        (
            subjects.PROJECTS_TRACKER_READ,
            b'{"project_id": "default", "tracker": "w", "level": "x"}',
        ),
    ]:
        reply = json.loads((await nc.request(subject, body, timeout=5)).data)
        assert reply["error"]["type"] == "invalid_request", (subject, reply)
        assert "resend" in reply["error"]["message"]


async def test_a_write_racing_the_projects_deletion_leaves_nothing(
    memory: MemoryService, client: ProjectsClient, redis: Redis
) -> None:
    """The store writes a page or a tracker only while its project exists (one script), so a
    write that passed the handler's check just before a delete cannot recreate its keys."""
    await client.create_project("Gone")
    await client.delete_project("gone", confirm="gone")
    store = memory.store
    with pytest.raises(errors.NotFound, match="gone"):
        await store.pages.write("gone", "late", "written after the delete", None)
    with pytest.raises(errors.NotFound, match="gone"):
        await store.trackers.log("gone", "late", 1.0, None, "2026-01-01", "")
    assert await redis.keys("loki:projects:*gone*") == []
