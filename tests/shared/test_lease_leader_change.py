"""The lease client through a change of leader among replicated supervisors (issue 44): a
renewal or release answered ``unavailable`` (no leader for a moment) or not answered is asked
again and the lease is kept; only ``not_found`` loses it. The supervisors' side is scripted
here (a request function); the real one is in tests/engine/test_leadership.py and
tests/chaos/test_supervisor_replicas_stack.py."""

from __future__ import annotations

import asyncio

import nats.errors

from loki_shared import subjects
from loki_shared.lease import lease
from loki_shared.messages.base import ErrorInfo
from loki_shared.messages.engine import Lease, LeaseRequest, ReleaseReply, RenewRequest

TTL = 0.6  # renewals every 0.2 s


class Supervisors:
    """Answers like replicated supervisors whose leader changes: ``script`` lists, per
    renewal, ``ok``, ``unavailable``, ``no_responders`` or ``not_found``; ``releases`` the
    release answers (then ``ok``)."""

    def __init__(self, script: list[str], releases: list[str] | None = None) -> None:
        self.script = list(script)
        self.releases = list(releases or [])
        self.renewals: list[str] = []
        self.released: list[str] = []
        self.granted = Lease(lease_id="L1", kind="main", base_url="http://e:1", ttl_s=TTL)

    async def __call__(self, subject: str, payload: bytes, timeout: float) -> bytes:
        if subject == subjects.ENGINE_LEASE:
            return self.granted.model_dump_json().encode()
        if subject == subjects.ENGINE_RENEW:
            RenewRequest.model_validate_json(payload)
            what = self.script.pop(0) if self.script else "ok"
            self.renewals.append(what)
            if what == "no_responders":
                raise nats.errors.NoRespondersError
            if what in ("unavailable", "not_found"):
                error = ErrorInfo(type=what, message=f"{what} (scripted)")
                return Lease(error=error).model_dump_json().encode()
            return self.granted.model_dump_json().encode()
        if subject == subjects.ENGINE_RELEASE:
            what = self.releases.pop(0) if self.releases else "ok"
            self.released.append(what)
            if what == "unavailable":
                error = ErrorInfo(type="unavailable", message="no supervisor leads")
                return ReleaseReply(error=error).model_dump_json().encode()
            return ReleaseReply(ok=True).model_dump_json().encode()
        raise nats.errors.NoRespondersError


async def test_renewals_ride_through_a_leader_change():
    sups = Supervisors(["ok", "no_responders", "unavailable", "unavailable", "ok", "ok"])
    async with lease(sups.__call__, LeaseRequest(kind="main", wait_s=5)) as held:
        while len(sups.renewals) < 6:
            await asyncio.sleep(0.05)
        assert not held.lost and held.renewals >= 3
    assert held.released and sups.released == ["ok"]


async def test_not_found_is_a_real_loss():
    sups = Supervisors(["ok", "unavailable", "not_found"])
    async with lease(sups.__call__, LeaseRequest(kind="main", wait_s=5)) as held:
        for _ in range(100):
            if held.lost:
                break
            await asyncio.sleep(0.05)
        assert held.lost and held.renewals == 1
        await asyncio.sleep(3 * TTL)
        assert len(sups.renewals) == 3  # no renewal after the loss


async def test_a_release_answered_unavailable_is_asked_again_within_the_ttl():
    sups = Supervisors([], releases=["unavailable", "unavailable", "ok"])
    async with lease(sups.__call__, LeaseRequest(kind="main", wait_s=5)) as held:
        pass
    assert held.released and sups.released == ["unavailable", "unavailable", "ok"]


async def test_a_release_unavailable_past_the_ttl_gives_up():
    sups = Supervisors([], releases=["unavailable"] * 100)
    async with lease(sups.__call__, LeaseRequest(kind="main", wait_s=5)) as held:
        pass
    assert not held.released and held.release_reply is not None
    assert 2 <= len(sups.released) < 100  # retried, then left to expire (bounded by ~5 s)
