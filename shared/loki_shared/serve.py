"""The one way a service answers a NATS request/reply subject: :func:`serve`.

Every request/reply handler of every service (chat, memory, recall, the engine supervisor,
perf, and the health responder of :mod:`loki_shared.health`) is registered with it::

    serve(broker, subjects.RECALL_BLOCK, on_block, queue=subjects.QUEUE_RECALL, max_workers=8)

    async def on_block(req: BlockRequest) -> BlockReply: ...

The request and reply types are the subject's row of :data:`loki_shared.subjects.EXCHANGES`;
a subject built per instance or service (not in the table) names them with ``request=`` and
``reply=``. The request is decoded here from the raw body by pydantic (exact big integers, one
error message for every service); what the handler raises, and a malformed request, are
answered ``{"error": {"type", "message"}}`` by the broker's exception middleware
(:func:`loki_shared.errors.exception_middleware`, on every broker of
:func:`loki_shared.nats.make_broker`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from faststream.nats import NatsBroker
from faststream.nats.annotations import NatsMessage
from pydantic import BaseModel, ValidationError

from . import subjects
from .errors import InvalidRequest

M = TypeVar("M", bound=BaseModel)

#: A request handler: the decoded request in, the reply model out (what it raises is answered
#: as the reply's ``error``).
Handler = Callable[[Any], Awaitable[BaseModel]]


def decode(model: type[M], body: bytes) -> M:
    """``body`` (a request's raw bytes) as ``model``, parsed by pydantic from the JSON.

    Raises:
        InvalidRequest: not JSON, or not valid for ``model``; the message names the model and
            the first field at fault, e.g. ``invalid PageWriteRequest: content: Field
            required — resend it corrected`` (``body`` when the JSON itself is broken).
    """
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidRequest(
            f"invalid {model.__name__}: {where}: {first['msg']} — resend it corrected"
        ) from exc


def exchange(
    subject: str,
    request: type[BaseModel] | None = None,
    reply: type[BaseModel] | None = None,
) -> tuple[type[BaseModel], type[BaseModel]]:
    """The (request type, reply type) served on ``subject``: its row of
    :data:`~loki_shared.subjects.EXCHANGES`, else ``request`` and ``reply`` as given.

    Raises:
        TypeError: a type given for a subject of the table is not the table's.
        ValueError: ``subject`` is an event (the table gives it no reply), or is not in the
            table and ``request`` or ``reply`` is missing.
    """
    row = subjects.EXCHANGES.get(subject)
    if row is None:
        if request is None or reply is None:
            raise ValueError(f"{subject} is not in EXCHANGES: name its request and reply types")
        return request, reply
    if row.reply is None:
        raise ValueError(f"{subject} is an event subject: nothing answers it")
    for given, listed in ((request, row.request), (reply, row.reply)):
        if given is not None and given is not listed:
            raise TypeError(f"{subject} carries {listed.__name__}, not {given.__name__}")
    return row.request, row.reply


def serve(
    broker: NatsBroker,
    subject: str,
    handler: Handler,
    *,
    queue: str = "",
    max_workers: int | None = None,
    request: type[BaseModel] | None = None,
    reply: type[BaseModel] | None = None,
) -> None:
    """Answer ``subject`` on ``broker`` (a FastStream ``NatsBroker``, not yet started) with
    ``handler``.

    Each message's body is decoded as the subject's request type (:func:`decode`), given to
    ``handler``, and what it returns, which must be an instance of the reply type, is the
    answer (serialised by the broker's encoder, pydantic's JSON of the model).

    Args:
        broker: where to subscribe.
        subject: a request/reply subject of :data:`~loki_shared.subjects.EXCHANGES`, or one
            built per conversation, instance or service with ``request`` and ``reply`` given.
        handler: ``async (request) -> reply``.
        queue: the queue group ("": none, every instance answers: a per-instance subject).
        max_workers: messages handled at once (None: FastStream's default, one at a time).
        request, reply: the types of a subject that is not in the table; ``reply`` may be
            ``BaseModel`` when the answer's model depends on the request (a chat
            ``ForwardRequest``). For a subject of the table they may be left out.

    Raises:
        TypeError, ValueError: at registration, see :func:`exchange`.

    Each request is answered ``{"error": {"type", "message"}}`` instead of the reply when:
    its body is not valid for the request type (``invalid_request``, see :func:`decode`);
    the handler raises (a :class:`~loki_shared.errors.LokiError` as its class says, anything
    else ``internal``); or the handler returns something else than the reply type
    (``internal``: a ``TypeError``, a bug).
    """
    request_type, reply_type = exchange(subject, request, reply)

    async def answer(msg: NatsMessage) -> Any:  # Any: FastStream would cast to the annotation
        result = await handler(decode(request_type, msg.body))
        if not isinstance(result, reply_type):
            raise TypeError(
                f"{subject} is answered with {reply_type.__name__}, not {type(result).__name__}"
            )
        return result

    answer.__name__ = answer.__qualname__ = "on_" + subject.replace(".", "_")
    if max_workers is None:
        broker.subscriber(subject, queue=queue)(answer)
    else:
        broker.subscriber(subject, queue=queue, max_workers=max_workers)(answer)
