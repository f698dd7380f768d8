"""Issue 22 (chaos run): a turn's end published while the gateway's NATS connection was away
still reaches an SSE client that stayed connected. The gateway process and fake chat peers on
a NATS of this module's own, restarted mid-turn on the same port."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.conftest import start_nats
from tests.fakes.gateway_peers import FakePeers

from .conftest import launch_gateway
from .sse_client import Frame, ended, read_events


def test_end_logged_while_nats_was_away_reaches_the_connected_client(
    tmp_path: Path, redis_url: str
) -> None:
    data = tmp_path / "nats"
    server = start_nats(data)
    peers = FakePeers(server.url).start()
    gw = launch_gateway(server.url, tmp_path / "home", redis_url=redis_url)
    try:
        cid = peers.new_conv("restart").info.id
        got: list[Frame] = []
        errors: list[BaseException] = []

        def read() -> None:
            try:
                with gw.client() as c:
                    got.extend(read_events(c, cid, until=ended, timeout=60))
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(1.0)  # attached: the (empty) replay is done, the stream is live
        peers.call(peers.emit(cid, {"role": "assistant", "content": "a"}))
        server.stop()
        # the end is appended to the log while NATS is away: never published live
        peers.skip_publish = {2}
        peers.call(peers.emit(cid, {}, finish_reason="stop"))
        server = start_nats(data, port=server.port)
        reader.join(70)
        assert not errors, errors
        seqs = [int(f.id) for f in got if f.id]
        assert seqs == [1, 2], seqs  # the end, once, after the live event, nothing twice
        assert ended(got)
        assert "replay what they missed" in gw.logs()
    finally:
        gw.proc.stop()
        peers.stop()
        server.stop()
