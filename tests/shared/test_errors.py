"""The one error tree and the services' boundary (``loki_shared.errors``), on a real NATS."""

from __future__ import annotations

import json
import logging
import uuid

import nats
import pytest
from pydantic import BaseModel

from loki_shared import errors
from loki_shared.messages.base import ErrorInfo, ErrorType, Reply
from loki_shared.nats import make_broker


class Ask(BaseModel):
    what: str


class Answer(Reply):
    text: str = ""


async def test_a_handler_that_raises_is_answered_with_its_error_type(nats_url, caplog):
    """Whatever a handler raises becomes ``{"error": {type, message}}``: a LokiError as its
    class says, a request not valid for its model as ``invalid_request``, anything else (a
    model the handler itself fails to validate included) as ``internal``, logged with its
    traceback; a handler that returns answers as usual."""
    subject = f"test.errors.{uuid.uuid4().hex}"
    broker = make_broker(nats_url, "errors-test")

    @broker.subscriber(subject)
    async def handle(req: Ask) -> Answer:
        if req.what == "missing":
            raise errors.NotFound("no such thing")
        if req.what == "locked":
            raise errors.Locked("unlock first")
        if req.what == "bug":
            raise KeyError("oops")
        if (
            req.what == "bad reply"
        ):  # a peer's reply the handler cannot read: not the caller's fault
            Answer.model_validate({"text": ["not", "a", "string"]})
        return Answer(text=req.what.upper())

    await broker.start()
    nc = await nats.connect(nats_url)
    try:

        async def ask(body: bytes) -> dict:
            return json.loads((await nc.request(subject, body, timeout=5)).data)

        assert Answer.model_validate(await ask(b'{"what": "hi"}')).text == "HI"
        missing = Answer.model_validate(await ask(b'{"what": "missing"}'))
        assert missing.error == ErrorInfo(type="not_found", message="no such thing")
        locked = await ask(b'{"what": "locked"}')
        assert locked == {"error": {"type": "locked", "message": "unlock first"}}
        with caplog.at_level(logging.ERROR, logger="loki.errors-test"):
            bug = await ask(b'{"what": "bug"}')
        assert bug["error"]["type"] == "internal" and "KeyError" in bug["error"]["message"]
        assert any(r.exc_info for r in caplog.records if r.name == "loki.errors-test")
        malformed = await ask(b'{"nothing": 1}')
        assert malformed["error"]["type"] == "invalid_request"
        assert "what" in malformed["error"]["message"]
        bad_reply = await ask(b'{"what": "bad reply"}')
        assert bad_reply["error"]["type"] == "internal"
        assert "ValidationError" in bad_reply["error"]["message"]
    finally:
        await nc.drain()
        await broker.stop()


CASES = [
    ("invalid_request", 400),
    ("forbidden", 403),
    ("not_found", 404),
    ("conflict", 409),
    ("busy", 409),
    ("locked", 423),
    ("unavailable", 503),
    ("internal", 500),
]


def test_every_documented_type_has_a_case():
    assert {type_ for type_, _ in CASES} == set(errors.ERROR_TYPES)


@pytest.mark.parametrize(("type_", "status"), CASES)
def test_a_reply_error_comes_back_as_the_class_of_its_type(type_: ErrorType, status: int):
    """Every documented ``error.type`` has its class (the gateway raises it again from a
    reply, with the type as OpenAI's ``code``); the class's type is the one it came from."""
    exc = errors.from_info(ErrorInfo(type=type_, message="m"))
    assert exc.type == type_ and exc.http_status == status
    assert exc.code == type_ and exc.message == "m"
    assert exc.info() == ErrorInfo(type=type_, message="m")


def test_an_undocumented_error_type_is_refused():
    """``error.type`` is a Literal of the documented values: a reply naming another does not
    validate (the gateway answers it as an unreadable reply)."""
    with pytest.raises(ValueError):
        Answer.model_validate({"error": {"type": "oops", "message": "m"}})
