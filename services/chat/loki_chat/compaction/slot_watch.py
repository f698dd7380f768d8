"""Whether a slot still holds a conversation's last request: the continuation path's
condition.

An accepted step stamps its conversation (:class:`~.state.Stamp`: the request as sent, the
engine, the slot). The stamp is void once any other request leaves for the engine:

- this instance's own requests move :attr:`SlotWatch.epoch` (a stamp counts only at the
  epoch it was taken at): every accepted step and every summary request;
- requests of other instances and of ``/v1`` clients are seen in the perf ring
  (``loki.perf.record``, stream ``LOKI_PERF``, an ordered JetStream consumer on new records
  only): a record on the stamp's slot (or with no slot known) voids it, except this
  conversation's own ``main`` step.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from loki_shared import subjects
from loki_shared.messages.engine import Lease
from loki_shared.messages.perf import PerfRecord

from ..bus import ChatBus
from .state import ConvState, Stamp

log = logging.getLogger("loki.chat.compaction")

#: Seconds before trying again to watch the perf ring when its stream is missing.
RETRY_S = 30.0


class SlotWatch:
    """Keeps the stamps of ``states`` true.

    Args:
        states: the policy's per-conversation states (shared, by conversation id).
        bus: the NATS bus (the perf ring is read through its connection).
    """

    def __init__(self, states: dict[str, ConvState], bus: ChatBus) -> None:
        self.states = states
        self.bus = bus
        self.epoch = 0
        #: the perf ring subscription (None until watching)
        self.subscription: Any = None
        self._retry_at = 0.0

    def stamp(
        self, st: ConvState, lease: Lease, body: bytes, usage: dict[str, Any] | None, count: int
    ) -> None:
        """An accepted step of ``st``'s conversation left with ``body`` (``count`` messages)
        under ``lease``: a new epoch (every other stamp is void) and ``st`` stamped with
        it. An external engine, or a body that is not a JSON object, leaves no stamp."""
        self.epoch += 1
        try:
            decoded = json.loads(body)
        except ValueError:
            decoded = None
        prompt = (usage or {}).get("prompt_tokens")
        completion = (usage or {}).get("completion_tokens")
        held = (
            prompt + completion if isinstance(prompt, int) and isinstance(completion, int) else None
        )
        st.stamp = (
            None
            if lease.external or not isinstance(decoded, dict)
            else Stamp(decoded, count, lease.model, lease.n_ctx, lease.id_slot, self.epoch, held)
        )

    def request_left(self) -> None:
        """Another request of this instance left for the engine: every stamp is void."""
        self.epoch += 1

    def on_perf(self, record: PerfRecord) -> None:
        """A request left for the engine (seen in the perf ring): a stamp on its slot is
        void."""
        if record.kind == "main":
            st = self.states.get(record.conversation or "")
            if st is not None and st.stamp is not None and st.stamp.epoch == self.epoch:
                return  # this conversation's own step
        for st in self.states.values():
            if st.stamp is not None and (
                record.slot is None or st.stamp.id_slot is None or record.slot == st.stamp.id_slot
            ):
                st.stamp = None

    async def start(self) -> None:
        """Start watching the perf ring (once; no connection yet: nothing; no stream yet:
        tried again :data:`RETRY_S` later)."""
        if self.subscription is not None:
            return
        nc = self.bus.connection
        if nc is None:
            return

        async def on(msg: Any) -> None:
            try:
                self.on_perf(PerfRecord.model_validate_json(msg.data))
            except Exception:  # noqa: BLE001 - an odd record never breaks compaction
                pass

        # an ordered JetStream consumer on the perf ring (new records only), never a plain
        # subscription on the subject: that would turn a publish into a missing stream into
        # a timeout for every publisher.
        if time.monotonic() < self._retry_at:
            return
        try:
            from nats.js.api import DeliverPolicy

            self.subscription = await nc.jetstream().subscribe(
                subjects.PERF_RECORD,
                cb=on,
                stream=subjects.STREAM_PERF,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.NEW,
            )
        except Exception as exc:  # noqa: BLE001 - no stream yet: try again later
            self._retry_at = time.monotonic() + RETRY_S
            log.info("not watching %s yet (%s)", subjects.PERF_RECORD, type(exc).__name__)
