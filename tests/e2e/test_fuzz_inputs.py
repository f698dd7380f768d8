"""Issue 38's fuzz pass on the whole stack as a user runs it (real services, real
llama-server and model): every JSON route under ``/api`` and ``/v1`` gets bodies whose
strings are non-BMP text, lone surrogates, NUL, control characters or huge
(:mod:`tests.gateway.fuzz_json`); no answer is a 5xx.

Bounded for CI on 2 cores: a few examples per route, derandomised. Left out: the two preset
routes whose body names a URL Loki would contact (``POST /api/presets``,
``/api/presets/test``: tests never send traffic outside loopback). Fixed fields keep the
run bounded: tasks are created switched off (none runs meanwhile), completions ask one
token, and the sends run last (their turns occupy the engine). The one 5xx allowed is the
documented 501 of ``/v1/embeddings`` on an engine started without ``--embeddings``."""

from __future__ import annotations

import httpx
import pytest

from loki_cli.stack import Stack
from tests.gateway.fuzz_json import run_fuzz

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_no_json_route_of_the_stack_answers_5xx(running_stack: Stack) -> None:
    base = f"http://127.0.0.1:{running_stack.config.web_port}"
    with httpx.Client(base_url=base, timeout=120) as client:
        conv = client.post("/api/conversations", json={"title": "fuzz"}).json()["conversation"]
        project = client.post("/api/projects", json={"name": "fuzz"}).json()
        project_id = (project.get("project") or project).get("id", "x1")
        spec = client.get("/openapi.json").json()
        one_token = {"max_tokens": 1, "max_output_tokens": 1, "stream": False}
        sent, failures = run_fuzz(
            client,
            spec,
            {"conversation": conv["id"], "project": project_id},
            examples=8,
            skip=("/api/presets", "/api/presets/test"),
            fixed={
                "/api/tasks": {"enabled": False},
                "/api/tasks/{task}": {"enabled": False},
                "/v1/chat/completions": one_token,
                "/v1/completions": one_token,
                "/v1/responses": one_token,
                "/api/chat/send": {"conversation": conv["id"]},
            },
            last=("/api/chat/send",),
            # the bundled engine runs without --embeddings: its documented 501 (never retried)
            allowed={"/v1/embeddings": 501},
        )
        client.post("/api/chat/stop", json={"conversation": conv["id"]})
    assert sent >= 120
    assert not failures, "\n".join(failures[:20])
