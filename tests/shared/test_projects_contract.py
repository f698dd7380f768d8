"""The memory service's contract: every ``loki.projects.*`` subject is in the table, only the
memory user answers them, and the client turns replies into the shared error classes."""

from __future__ import annotations

import asyncio

import pytest

from loki_shared import errors, permissions, subjects
from loki_shared.messages import projects as m
from loki_shared.projects_client import ProjectsClient

PROJECT_SUBJECTS = [
    value
    for name, value in vars(subjects).items()
    if name.startswith("PROJECTS_") and name != "PROJECTS_PREFIX" and isinstance(value, str)
]


def test_every_projects_subject_has_an_exchange_row() -> None:
    assert len(PROJECT_SUBJECTS) == 19
    for subject in PROJECT_SUBJECTS:
        assert subject in subjects.EXCHANGES, subject
    assert subjects.EXCHANGES[subjects.PROJECTS_CHANGED].reply is None
    assert not any(s.startswith("loki.memory.") for s in PROJECT_SUBJECTS)


def test_only_the_memory_user_answers_projects_requests() -> None:
    requests = {s for s in PROJECT_SUBJECTS if subjects.EXCHANGES[s].reply is not None}
    for row in permissions.USERS:
        served = requests & set(row.subscribe)
        assert served == (requests if row.user == "memory" else set()), row.user
    publishers = {r.user for r in permissions.USERS if subjects.PROJECTS_CHANGED in r.publish}
    assert publishers == {"memory"}
    assert "memory" in permissions.SERVICES


def test_client_raises_the_replys_error_and_unavailable_on_no_answer() -> None:
    async def locked(subject: str, data: bytes, timeout: float) -> bytes:
        return b'{"error": {"type": "locked", "message": "memory locked"}}'

    async def silent(subject: str, data: bytes, timeout: float) -> bytes:
        raise TimeoutError

    async def ok(subject: str, data: bytes, timeout: float) -> bytes:
        assert subject == subjects.PROJECTS_ACTIVE
        return (
            m.ProjectReply(project=m.Project(id="default", name="Default"))
            .model_dump_json()
            .encode()
        )

    with pytest.raises(errors.Locked):
        asyncio.run(ProjectsClient(locked).block())
    with pytest.raises(errors.Unavailable):
        asyncio.run(ProjectsClient(silent).list_projects())
    assert asyncio.run(ProjectsClient(ok).active_project()).id == "default"
