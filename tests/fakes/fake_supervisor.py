"""A fake engine supervisor: answers ``loki.engine.info`` / ``lease`` / ``renew`` /
``release`` for one engine URL (the scripted fake engine or a real llama-server), and keeps
what it was asked. Used by the chat, compaction and gateway tests.

Either subscribe it on a nats-py connection (:meth:`FakeSupervisor.start`), or call its
handlers from another responder (the gateway's fake peers do, on their own loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loki_shared import subjects
from loki_shared.messages.base import ErrorInfo
from loki_shared.messages.engine import (
    EngineInfo,
    EngineSummary,
    Lease,
    LeaseRequest,
    Placement,
    ReleaseReply,
    ReleaseRequest,
    RenewRequest,
    TemplateProbe,
)


@dataclass
class FakeSupervisor:
    """The supervisor's lease protocol, in memory.

    Args (fields):
        nc: a nats-py connection for :meth:`start` (None when the handlers are called
            directly).
        base_url: the engine every lease points at; with ``info_stopped_without_url``, an
            empty one makes ``info`` answer ``stopped``.
        refuse: None (grant leases) or the ``error.type`` every lease request gets, with
            ``refuse_message``.
        ttl_s: the leases' ``ttl_s`` (0: no expiry, nothing to renew).
        lease_prefix: lease ids are this prefix and the number of lease requests so far.

    Records: ``requests`` (every lease request, in order; also :attr:`leases`), ``live`` (granted, not released),
    ``released`` (every id asked to release), ``granted``, ``release_count`` (releases of a
    live lease), ``renew_count``.
    """

    nc: Any = None
    base_url: str = ""
    n_ctx: int = 4096
    model: str = "fake-model"
    id_slot: int | None = None
    external: bool = False
    api_key: str | None = None
    total_slots: int = 1
    ttl_s: float = 0.0
    lease_prefix: str = "l"
    refuse: str | None = None
    refuse_message: str = "engine stopped"
    info_stopped_without_url: bool = False
    template: TemplateProbe | None = None  # the template probe's verdicts, sent with leases
    max_tokens: int | None = None  # the preset's cap on one step, sent with leases
    vision: bool = False  # what ``info`` says of the engine's vision
    verify: bool | None = None  # the preset's VERIFY feature, sent with leases
    slot_persist: dict[str, Any] | None = None  # what ``info`` says of SLOT_PERSIST
    extra_in_flight: int = 0  # requests ``info`` counts in flight beside the live leases
    silent_release: bool = False  # releases recorded, never answered (a supervisor away)
    placement: Placement | None = None  # sent with every lease (several engines, issue 44)
    engines: list[EngineSummary] = field(default_factory=list)  # what ``info`` lists
    routing: str = ""  # what ``info`` says of the pool's policy
    instance: str = ""  # what ``info`` says of this supervisor process
    leader: str | None = None  # what ``info`` says of the replicas' leader
    requests: list[LeaseRequest] = field(default_factory=list)
    live: dict[str, LeaseRequest] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)
    release_requests: list[ReleaseRequest] = field(default_factory=list)
    granted: int = 0
    release_count: int = 0
    renew_count: int = 0
    subs: list[Any] = field(default_factory=list)

    @property
    def leases(self) -> list[LeaseRequest]:
        """Every lease request, in order (the same list as ``requests``)."""
        return self.requests

    # --- the handlers ------------------------------------------------------------------------
    def info(self, _: Any = None) -> EngineInfo:
        stopped = self.info_stopped_without_url and not self.base_url
        return EngineInfo(
            state="stopped" if stopped else "ready",
            base_url=self.base_url,
            n_ctx=self.n_ctx,
            total_slots=self.total_slots,
            model=self.model,
            vision=self.vision,
            slot_persist=self.slot_persist,
            in_flight=len(self.live) + self.extra_in_flight,
            template=self.template,
            engines=self.engines,
            routing=self.routing,
            instance=self.instance,
            leader=self.leader,
        )

    def lease(self, req: LeaseRequest) -> Lease:
        self.requests.append(req)
        if self.refuse:
            return Lease(error=ErrorInfo(type=self.refuse, message=self.refuse_message))
        lease_id = f"{self.lease_prefix}{len(self.requests)}"
        self.live[lease_id] = req
        self.granted += 1
        return Lease(
            lease_id=lease_id,
            kind=req.kind,
            base_url=self.base_url,
            id_slot=self.id_slot,
            n_ctx=self.n_ctx,
            model=self.model,
            ttl_s=self.ttl_s,
            external=self.external,
            api_key=self.api_key,
            template=self.template,
            vision=self.vision,
            max_tokens=self.max_tokens,
            verify=self.verify,
            placement=self.placement,
        )

    def renew(self, req: RenewRequest) -> Lease:
        self.renew_count += 1
        if req.lease_id not in self.live:
            return Lease(error=ErrorInfo(type="not_found", message="expired"))
        return Lease(lease_id=req.lease_id, base_url=self.base_url, ttl_s=self.ttl_s)

    def release(self, req: ReleaseRequest) -> ReleaseReply | None:
        self.released.append(req.lease_id)
        self.release_requests.append(req)
        ok = self.live.pop(req.lease_id, None) is not None
        self.release_count += ok
        return None if self.silent_release else ReleaseReply(ok=ok)

    def held(self) -> int:
        """Leases granted and not released."""
        return len(self.live)

    # --- on NATS -----------------------------------------------------------------------------
    async def start(self) -> FakeSupervisor:
        """Subscribe the handlers on :attr:`nc` (core NATS, no queue group)."""
        table = {
            subjects.ENGINE_LEASE: (LeaseRequest, self.lease),
            subjects.ENGINE_RENEW: (RenewRequest, self.renew),
            subjects.ENGINE_RELEASE: (ReleaseRequest, self.release),
            subjects.ENGINE_INFO: (None, self.info),
        }
        for subject, (model, handler) in table.items():
            self.subs.append(await self.nc.subscribe(subject, cb=responder(model, handler)))
        await self.nc.flush()
        return self

    async def stop(self) -> None:
        for sub in self.subs:
            await sub.unsubscribe()
        self.subs = []


def responder(model: Any, handler: Any) -> Any:
    """A nats-py callback: decode the request as ``model`` (None: no body), call
    ``handler`` (plain or async) and respond with its reply's JSON (no reply: no response)."""

    async def cb(msg: Any) -> None:
        request = model.model_validate_json(msg.data) if model else None
        reply = handler(request)
        if hasattr(reply, "__await__"):
            reply = await reply
        if reply is None:
            return
        await msg.respond(reply.model_dump_json().encode())

    return cb
