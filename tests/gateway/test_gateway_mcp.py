"""``/api/mcp/servers…`` end to end (issue 42): the gateway (``python -m loki_gateway``,
behind an API key, its own NATS user) and a chat service (in process, user ``chat``) on the
session NATS and Redis, and a real MCP server on Streamable HTTP (``tests/fakes/mcp_server.py``).

A person adds a server with a bearer token, lists it, tests it, edits it, switches it off
and deletes it; no answer ever carries the token (only the header's name). Bad bodies are
OpenAI-shaped 4xx. No route can make Loki start a command: the bodies have no command field
and refuse unknown ones, and a stdio server of ``LOKI_HOME/mcp.json`` can only be switched
off or on per project through the API."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from loki_shared.messages.mcp import McpServerPatch, McpServerSpec
from tests.chat.helpers import ChatRunner
from tests.fakes.mcp_server import SERVER, SLOW

from .conftest import launch_gateway

KEY = "mcp-test-key"
TOKEN = "tok-secret-42"


@pytest.fixture
async def stack(nats_url: str, redis_db: str, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    runner = ChatRunner(nats_url, redis_db, tmp_path / "home")
    await runner.start(mcp_timeout_s=90.0)
    gw = launch_gateway(nats_url, tmp_path / "gw-home", KEY)
    try:
        async with httpx.AsyncClient(
            base_url=gw.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=SLOW
        ) as api:
            yield {"api": api, "gw": gw, "home": tmp_path / "home"}
    finally:
        gw.proc.stop()
        await runner.stop_all()


def error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    assert set(err) >= {"message", "type", "code"} and err["message"]
    return err


async def test_add_list_test_edit_disable_delete_never_returning_the_token(stack, http_mcp):
    api: httpx.AsyncClient = stack["api"]
    async with httpx.AsyncClient(base_url=stack["gw"].url) as anonymous:
        error_of(await anonymous.get("/api/mcp/servers"), 401)
    url, _ = http_mcp(env={"MCP_TOKEN": TOKEN})
    seen: list[str] = []

    async def call(method: str, path: str, **kw: Any) -> httpx.Response:
        r = await api.request(method, path, **kw)
        seen.append(r.text)
        return r

    r = await call("GET", "/api/mcp/servers")
    assert r.status_code == 200 and r.json() == {"servers": []}
    body = {"name": "remote", "url": url, "headers": {"Authorization": f"Bearer {TOKEN}"}}
    r = await call("POST", "/api/mcp/servers", json=body)
    assert r.status_code == 201, r.text
    server = r.json()["server"]
    assert server["state"] == "up" and server["source"] == "api" and server["transport"] == "http"
    assert server["header_names"] == ["Authorization"] and "remote__echo" in server["tools"]
    r = await call("GET", "/api/mcp/servers")
    assert [s["name"] for s in r.json()["servers"]] == ["remote"]
    r = await call("POST", "/api/mcp/servers/remote/test")
    assert r.status_code == 200 and r.json()["test"]["ok"] is True
    assert "echo" in r.json()["test"]["tools"]
    r = await call("PATCH", "/api/mcp/servers/remote", json={"projects_off": ["p1"]})
    assert r.json()["server"]["projects_off"] == ["p1"]
    assert r.json()["server"]["header_names"] == ["Authorization"]  # the headers stay
    r = await call("PATCH", "/api/mcp/servers/remote", json={"enabled": False})
    assert r.json()["server"]["enabled"] is False and r.json()["server"]["state"] == "off"
    r = await call("PUT", "/api/mcp/servers/remote", json={"enabled": True, "headers": {}})
    assert r.json()["server"]["header_names"] == []  # replaced: the server now refuses us
    r = await call("POST", "/api/mcp/servers/remote/test")
    assert r.json()["test"]["ok"] is False and r.json()["test"]["error"]
    r = await call("DELETE", "/api/mcp/servers/remote")
    assert r.json() == {"ok": True, "deleted": "remote"}
    assert (await call("GET", "/api/mcp/servers")).json() == {"servers": []}
    error_of(await call("DELETE", "/api/mcp/servers/remote"), 404)
    assert not any(TOKEN in text for text in seen)


async def test_bad_input_is_an_openai_shaped_4xx(stack):
    api: httpx.AsyncClient = stack["api"]
    ok = {"name": "a", "url": "http://127.0.0.1:9/mcp"}
    for bad, param in (
        ({**ok, "name": "bad name"}, "name"),
        ({**ok, "url": "ftp://x"}, "url"),
        ({"name": "a"}, "url"),
        ({**ok, "headers": {"A": 1}}, "headers.A"),
    ):
        err = error_of(await api.post("/api/mcp/servers", json=bad), 400)
        assert err["type"] == "invalid_request_error" and err["param"] == param, err
    error_of(await api.post("/api/mcp/servers", content=b"{not json"), 400)
    assert (await api.post("/api/mcp/servers", json=ok)).status_code == 201
    err = error_of(await api.post("/api/mcp/servers", json=ok), 409)
    assert "exists" in err["message"]
    error_of(await api.patch("/api/mcp/servers/nope", json={"enabled": False}), 404)
    error_of(await api.patch("/api/mcp/servers/a", json={"enabled": "maybe"}), 400)
    error_of(await api.post("/api/mcp/servers/nope/test"), 404)
    err = error_of(await api.patch("/api/mcp/servers/bad%20name", json={}), 400)
    assert err["param"] == "name"


async def test_no_route_can_make_loki_start_a_command(stack, tmp_path):
    api: httpx.AsyncClient = stack["api"]
    marker = tmp_path / "started"
    command = {"command": sys.executable, "args": ["-c", f"open({str(marker)!r}, 'w')"]}
    ok = {"name": "x", "url": "http://127.0.0.1:9/mcp"}
    for body in (
        {**ok, **command},
        {**ok, "transport": "stdio", **command},
        {"name": "x", **command},
    ):
        err = error_of(await api.post("/api/mcp/servers", json=body), 400)
        assert err["type"] == "invalid_request_error"
    assert (await api.post("/api/mcp/servers", json=ok)).status_code == 201
    for method in ("PUT", "PATCH"):
        error_of(await api.request(method, "/api/mcp/servers/x", json=command), 400)
    # the body models the routes read have no field that names a command
    for model in (McpServerSpec, McpServerPatch):
        assert not {"command", "args", "env", "cwd"} & set(model.model_fields)
        assert model.model_config.get("extra") == "forbid"
    # a stdio server is the file's: the API lists it and switches it, nothing more
    home: Path = stack["home"]
    home.mkdir(parents=True, exist_ok=True)
    entry = {"command": sys.executable, "args": [str(SERVER), "stdio"]}
    (home / "mcp.json").write_text(json.dumps({"servers": {"local": entry}}))
    listed = {s["name"]: s for s in (await api.get("/api/mcp/servers")).json()["servers"]}
    assert listed["local"]["source"] == "file" and listed["local"]["transport"] == "stdio"
    err = error_of(await api.patch("/api/mcp/servers/local", json={"url": "http://a/b"}), 400)
    assert "mcp.json" in err["message"]
    error_of(await api.delete("/api/mcp/servers/local"), 400)
    r = await api.patch("/api/mcp/servers/local", json={"enabled": False})
    assert r.status_code == 200 and r.json()["server"]["state"] == "off", r.text
    assert not marker.exists()
