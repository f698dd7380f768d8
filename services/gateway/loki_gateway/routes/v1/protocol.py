"""The ``/v1`` protocol: request checks, the documented rewrites, OpenAI's error shape.

The client's body reaches the engine as the client wrote it, except these rewrites (each
shown by a test named in ``docs/behaviour.md``, gateway section); nothing else is touched, a
valid OpenAI body keeps every other field and value:

- ``id_slot``: the lease's, or removed when the lease names none (:func:`upstream_body`);
- ``stream: true`` and ``stream_options.include_usage: true``: every completion is streamed
  upstream (a non-streamed one is assembled by the gateway) with the usage asked for the perf
  record (:func:`upstream_body`);
- leniencies for bodies OpenAI itself would take or that clients send (issue 8): an empty
  assistant turn (no content, no tool calls, no reasoning) is removed; a tool without
  ``parameters`` gets ``{"type": "object", "properties": {}}``; ``tool_calls[].function.
  arguments`` given as a JSON object becomes its JSON text (OpenAI's type is a string), absent
  or null becomes ``"{}"``; a ``tool`` message with ``content: null`` gets ``""``; ``type:
  "function"`` is added to a tool call or a tool that lacks it; an empty ``tools`` list is
  removed (:func:`normalise_chat`).

An assistant message with ``content: null`` and ``tool_calls`` is sent as is (llama-server
takes it; rewriting it to ``""`` broke clients that compare what they sent, litellm #37711).

Checks: the body must be a JSON object; ``messages`` a non-empty list of objects whose
``role`` is ``system``, ``developer``, ``user``, ``assistant`` or ``tool``; ``n`` above 1 is
refused with 400 ``unsupported_value`` (llama-server answers one choice).

Errors: the engine's context-overflow error (llama.cpp ``exceed_context_size_error``, 400)
becomes OpenAI's ``context_length_exceeded``; 501 (a feature the engine was not started
with, e.g. embeddings) stays 501; other 5xx become 502 ``upstream_error`` (:func:`engine_error`).
"""

from __future__ import annotations

import functools
import json
import os
import re
from typing import Any

from loki_shared.messages.engine import Lease
from loki_shared.sse import json_object

from ...errors import BadRequest

ROLES = {"system", "developer", "user", "assistant", "tool"}
EMPTY_SCHEMA = {"type": "object", "properties": {}}

#: OpenAPI request schemas of the routes (what the fuzz test draws bodies from; the route
#: checks more than this, see :func:`normalise_chat`).
CHAT_SCHEMA = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        "model": {"type": "string"},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"type": "string"},
                    "content": {"type": ["string", "null"]},
                },
            },
        },
        "stream": {"type": "boolean"},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 16},
        "n": {"type": "integer"},
    },
}
COMPLETION_SCHEMA = {
    "type": "object",
    "required": ["prompt"],
    "properties": {
        "prompt": {"type": "string"},
        "stream": {"type": "boolean"},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 16},
    },
}
RESPONSES_SCHEMA = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "model": {"type": "string"},
        "input": {"type": ["string", "array"]},
        "instructions": {"type": "string"},
        "stream": {"type": "boolean"},
        "max_output_tokens": {"type": "integer", "minimum": 1, "maximum": 16},
    },
}
EMBED_SCHEMA = {
    "type": "object",
    "required": ["input"],
    "properties": {"input": {"type": "string"}},
}


def parse_object(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be one JSON object.

    Raises:
        BadRequest: empty, not UTF-8 JSON, nested too deeply, or not an object.
    """
    if not raw.strip():
        raise BadRequest("request body is empty; a JSON object is expected", code="invalid_json")
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    except RecursionError as exc:
        raise BadRequest("request body is nested too deeply", code="invalid_json") from exc
    if not isinstance(value, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    return value


def _check_n(body: dict[str, Any]) -> None:
    n = body.get("n")
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BadRequest("n must be a positive integer", code="invalid_value")
    if n > 1:
        raise BadRequest(
            "n > 1 is not supported: the engine returns one choice per request; "
            "send n separate requests instead",
            code="unsupported_value",
        )


def _check_stream(body: dict[str, Any]) -> None:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean", code="invalid_value")
    opts = body.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise BadRequest("stream_options must be an object", code="invalid_value")


def _content_ok(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(isinstance(p, dict) for p in content)


def _is_empty(content: Any) -> bool:
    return content is None or content == "" or content == []


def normalise_chat(body: dict[str, Any]) -> dict[str, Any]:
    """Check a ``/v1/chat/completions`` body and apply the leniencies of the module
    docstring, in place; returns it.

    Raises:
        BadRequest: ``messages``, ``tools``, ``n``, ``stream`` malformed (message says which).
    """
    _check_n(body)
    _check_stream(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty array", code="invalid_value")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(f"messages[{i}] must be an object", code="invalid_value")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise BadRequest(
                f"messages[{i}].role must be one of {sorted(ROLES)}", code="invalid_value"
            )
        if not _content_ok(message.get("content")):
            raise BadRequest(
                f"messages[{i}].content must be a string, an array of parts or null",
                code="invalid_value",
            )
        tool_calls = message.get("tool_calls")
        if tool_calls is not None:
            if role != "assistant" or not isinstance(tool_calls, list):
                raise BadRequest(
                    f"messages[{i}].tool_calls must be an array on an assistant message",
                    code="invalid_value",
                )
            for j, call in enumerate(tool_calls):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise BadRequest(
                        f"messages[{i}].tool_calls[{j}].function.name is required",
                        code="invalid_value",
                    )
                args = fn.get("arguments")
                if args is None:
                    fn["arguments"] = "{}"
                elif not isinstance(args, str):
                    fn["arguments"] = json.dumps(args, ensure_ascii=False)
                call.setdefault("type", "function")
        if role == "assistant":
            if (
                not tool_calls
                and _is_empty(message.get("content"))
                and not message.get("reasoning_content")
            ):
                continue  # an empty assistant turn says nothing: dropped
        elif role == "tool" and message.get("content") is None:
            message["content"] = ""
        out.append(message)
    if not out:
        raise BadRequest("messages holds only empty assistant turns", code="invalid_value")
    body["messages"] = out
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("tools must be an array", code="invalid_value")
        for k, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise BadRequest(f"tools[{k}].function.name is required", code="invalid_value")
            tool.setdefault("type", "function")
            if fn.get("parameters") is None:
                fn["parameters"] = dict(EMPTY_SCHEMA)
        if not tools:
            del body["tools"]
    return body


def normalise_completion(body: dict[str, Any]) -> dict[str, Any]:
    """Check a ``/v1/completions`` body (``prompt`` required, ``n``, ``stream``).

    Raises:
        BadRequest: what is wrong.
    """
    _check_n(body)
    _check_stream(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, (str, list)):
        raise BadRequest("prompt must be a string or an array", code="invalid_value")
    return body


def normalise_responses(body: dict[str, Any]) -> dict[str, Any]:
    """Check a ``/v1/responses`` body: ``input`` a string or an array of objects, ``stream``
    a boolean, no ``previous_response_id`` (the engine keeps no responses: llama.cpp refuses
    it too).

    Raises:
        BadRequest: what is wrong (``param`` names the field).
    """
    _check_stream(body)
    value = body.get("input")
    if not isinstance(value, (str, list)) or (
        isinstance(value, list) and not all(isinstance(item, dict) for item in value)
    ):
        raise BadRequest(
            "input must be a string or an array of input items", code="invalid_value", param="input"
        )
    if body.get("previous_response_id"):
        raise BadRequest(
            "previous_response_id is not supported: the engine keeps no responses; send the "
            "whole conversation in input",
            code="unsupported_value",
            param="previous_response_id",
        )
    return body


def normalise_embeddings(body: dict[str, Any]) -> dict[str, Any]:
    """Check a ``/v1/embeddings`` body (``input`` required).

    Raises:
        BadRequest: what is wrong.
    """
    value = body.get("input", body.get("content"))
    if not isinstance(value, (str, list)) or (isinstance(value, list) and not value):
        raise BadRequest("input must be a string or a non-empty array", code="invalid_value")
    return body


def is_context_overflow(status: int, error: dict[str, Any]) -> bool:
    """Whether an engine error is a context overflow.

    llama.cpp answers 400 with ``{"error": {"type": "exceed_context_size_error", ...}}``
    (older builds: a message about the context size); OpenAI calls this
    ``context_length_exceeded``.
    """
    if error.get("type") == "exceed_context_size_error" or error.get("code") in (
        "context_length_exceeded",
    ):
        return True
    message = str(error.get("message", "")).lower()
    return (
        status == 400
        and "context" in message
        and ("exceed" in message or "too long" in message or "larger than" in message)
    )


def engine_error(status: int, raw: bytes) -> tuple[int, dict[str, Any]]:
    """Translate an engine error answer into (status, OpenAI error body).

    4xx keep their status; 501 stays 501 (llama-server: a feature it was not started with,
    e.g. ``/v1/embeddings`` without ``--embeddings``: SDKs must not retry it); other 5xx
    become 502 (the engine, not the gateway, failed).
    """
    payload = json_object(raw)
    error = payload.get("error") if payload is not None else None
    if not isinstance(error, dict):
        error = {"message": raw[:500].decode("utf-8", "replace") or f"engine status {status}"}
    message = str(error.get("message") or f"engine status {status}")
    if is_context_overflow(status, error):
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
        for extra in ("n_prompt_tokens", "n_ctx"):
            if extra in error:
                body["error"][extra] = error[extra]
        return 400, body
    if status == 501:  # not implemented (llama-server: a feature it was not started with)
        return 501, {
            "error": {
                "message": message,
                "type": str(error.get("type") or "not_supported_error"),
                "param": None,
                "code": error.get("code") if isinstance(error.get("code"), str) else None,
            }
        }
    if status >= 500:
        return 502, {
            "error": {
                "message": f"engine error: {message}",
                "type": "upstream_error",
                "param": None,
                "code": str(error.get("type") or status),
            }
        }
    type_ = error.get("type") if isinstance(error.get("type"), str) else "invalid_request_error"
    code = error.get("code")
    return status, {
        "error": {
            "message": message,
            "type": type_,
            "param": error.get("param") if isinstance(error.get("param"), str) else None,
            "code": code if isinstance(code, str) else None,
        }
    }


def upstream_body(body: dict[str, Any], lease: Lease) -> bytes:
    """The bytes sent to the engine for a completion: the client's body with the protocol
    rewrites only — ``stream: true``, ``stream_options.include_usage: true`` (other
    ``stream_options`` kept), ``id_slot`` the lease's (removed when it names none). The
    client's body is not modified."""
    out = dict(body)
    out["stream"] = True
    opts = body.get("stream_options")
    out["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
    if lease.id_slot is not None:
        out["id_slot"] = lease.id_slot
    else:
        out.pop("id_slot", None)
    return json.dumps(out, ensure_ascii=False).encode("utf-8")


def passthrough_body(body: dict[str, Any], lease: Lease) -> bytes:
    """The bytes sent to the engine for a request that is not a completion (embeddings):
    the client's body, ``id_slot`` the lease's (removed when it names none)."""
    out = dict(body)
    if lease.id_slot is not None:
        out["id_slot"] = lease.id_slot
    else:
        out.pop("id_slot", None)
    return json.dumps(out, ensure_ascii=False).encode("utf-8")


def wants_usage(body: dict[str, Any]) -> bool:
    """Whether the client asked for the usage chunk (``stream_options.include_usage``)."""
    opts = body.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


def model_id(value: Any) -> Any:
    """A model id as ``/v1/models`` shows it: llama-server names a model by the path it was
    started with (``-m /models/x/Qwen3-8B-Q4_K_M.gguf``); the id is the file name
    (``Qwen3-8B-Q4_K_M.gguf``), so the server's directories are not shown and clients keep a
    short, stable name. Anything else is returned unchanged."""
    if isinstance(value, str) and ("/" in value or "\\" in value):
        return os.path.basename(value.replace("\\", "/")) or value
    return value


def models_reply(payload: Any) -> Any:
    """llama-server's ``/v1/models`` answer with every model id made a file name
    (:func:`model_id`): ``data[].id`` and ``data[].aliases[]`` (OpenAI's list; llama.cpp
    adds the aliases) and ``models[].name`` / ``models[].model`` (llama-server's own list)."""
    if not isinstance(payload, dict):
        return payload
    for item in payload.get("data") or []:
        if isinstance(item, dict):
            if "id" in item:
                item["id"] = model_id(item["id"])
            if isinstance(item.get("aliases"), list):
                item["aliases"] = list(dict.fromkeys(model_id(a) for a in item["aliases"]))
    for item in payload.get("models") or []:
        if isinstance(item, dict):
            for key in ("name", "model"):
                if key in item:
                    item[key] = model_id(item[key])
    return payload


#: A ``"model": "<text>"`` member in an engine's JSON; group 2 is the JSON string's body.
#: Never text inside a string: there every quote is escaped, so ``model`` cannot be followed
#: by a bare quote.
_MODEL_MEMBER = re.compile(rb'("model"\s*:\s*)"([^"\\]*(?:\\.[^"\\]*)*)"')
#: A quick look for a ``model`` member whose value may hold a path (most chunks have none).
_MODEL_PATH_HINT = re.compile(rb'"model"\s*:\s*"[^"]*[/\\]')


@functools.lru_cache(maxsize=64)
def _renamed(body: bytes) -> bytes | None:
    """The JSON string for the model named by the JSON string body ``body`` (None: keep)."""
    if b"/" not in body and b"\\" not in body:
        return None
    try:
        value = json.loads(b'"' + body + b'"')
    except ValueError:
        return None
    return json.dumps(model_id(value), ensure_ascii=False).encode("utf-8")


def _model_member(match: re.Match[bytes]) -> bytes:
    renamed = _renamed(match.group(2))
    return match.group(0) if renamed is None else match.group(1) + renamed


def rename_models(raw: bytes) -> bytes:
    """An engine answer's bytes (JSON or SSE) with every ``model`` member naming a model by
    a path made its file name (:func:`model_id`), as ``/v1/models`` lists it: llama-server
    names the model by the path it was started with in every answer and chunk. Everything
    else is left byte for byte."""
    if _MODEL_PATH_HINT.search(raw) is None:
        return raw
    return _MODEL_MEMBER.sub(_model_member, raw)


def error_frame(message: str, type_: str = "upstream_error", code: str | None = None) -> bytes:
    """A mid-stream SSE error event in OpenAI's shape: ``data: {"error": {"message",
    "type", "param", "code"}}`` (what the ``openai`` SDKs raise on)."""
    payload = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n"
