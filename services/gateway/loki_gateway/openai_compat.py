"""Checks and normalisation of OpenAI request bodies before they reach the engine, and the
translation of the engine's errors into OpenAI's.

Rules (each shown by a test named in ``docs/behaviour.md (gateway)``):

- the body must be a JSON object; ``messages`` a non-empty list of objects whose ``role`` is
  ``system``, ``developer``, ``user``, ``assistant`` or ``tool``;
- ``n`` above 1 is refused with 400 ``unsupported_value`` (llama-server answers one choice);
- an assistant message with ``content: null`` and ``tool_calls`` gets ``content: ""``
  (some chat templates index the content as a string);
- ``tool_calls[].function.arguments`` given as a JSON object is serialised to its JSON text
  (OpenAI's type is a string);
- a tool without ``parameters`` gets the empty object schema
  ``{"type": "object", "properties": {}}``;
- an empty assistant turn (no content, no tool calls) is removed;
- the engine's context-overflow error (llama.cpp ``exceed_context_size_error``, 400) becomes
  OpenAI's ``context_length_exceeded`` (400, ``invalid_request_error``).
"""

from __future__ import annotations

import json
from typing import Any

from .errors import BadRequest

ROLES = {"system", "developer", "user", "assistant", "tool"}
EMPTY_SCHEMA = {"type": "object", "properties": {}}


def parse_object(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be one JSON object.

    Raises:
        BadRequest: empty, not UTF-8 JSON, or not an object.
    """
    if not raw.strip():
        raise BadRequest("request body is empty; a JSON object is expected", code="invalid_json")
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="invalid_json") from exc
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
    """Check and normalise a ``/v1/chat/completions`` body in place; returns it.

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
            if not tool_calls:
                del message["tool_calls"]
                tool_calls = None
        if role == "assistant":
            if tool_calls and message.get("content") is None:
                message["content"] = ""
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

    4xx keep their status; 5xx become 502 (the engine, not the gateway, failed).
    """
    try:
        payload = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        error = {"message": raw[:500].decode("utf-8", "replace") or f"engine status {status}"}
    message = str(error.get("message") or f"engine status {status}")
    if is_context_overflow(status, error):
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
                "param": "messages",
            }
        }
        for extra in ("n_prompt_tokens", "n_ctx"):
            if extra in error:
                body["error"][extra] = error[extra]
        return 400, body
    if status >= 500:
        return 502, {
            "error": {
                "message": f"engine error: {message}",
                "type": "upstream_error",
                "code": str(error.get("type") or status),
            }
        }
    type_ = error.get("type") if isinstance(error.get("type"), str) else "invalid_request_error"
    code = error.get("code")
    return status, {
        "error": {
            "message": message,
            "type": type_,
            "code": code if isinstance(code, str) else None,
        }
    }
