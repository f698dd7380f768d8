"""A real Redis Sentinel topology on loopback for the tests: a master, one replica, three
sentinels, every server with the ACL users of :mod:`loki_shared.permissions` (the session's
passwords, :data:`tests.conftest.AUTH`) plus the replication and sentinel users of
:mod:`loki_shared.redis_ha`.

``SentinelTopology.start(folder)`` returns once the sentinels know the replica and each
other (a failover can happen); :meth:`url` is the ``redis+sentinel://`` URL a service gets.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from loki_shared import credentials, redis_ha, servers
from tests.conftest import AUTH, TEST_USER

SERVICE = "loki"


@dataclass
class SentinelTopology:
    master: servers.RunningServer
    replica: servers.RunningServer
    sentinels: list[tuple[int, servers.ManagedProcess]]
    replication_password: str
    sentinel_password: str
    stopped: list[servers.RunningServer] = field(default_factory=list)

    @classmethod
    def start(cls, folder: Path, down_after_ms: int = 1000) -> SentinelTopology:
        folder.mkdir(parents=True, exist_ok=True)
        repl_pw, sent_pw = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
        extra = {**AUTH.redis_extra(), **redis_ha.acl_users(repl_pw, sent_pw)}

        def conf(name: str, master: tuple[str, int] | None) -> Path:
            path = credentials.write_redis_config(folder / f"{name}.conf", AUTH.creds, extra)
            with path.open("a") as fh:
                fh.write(redis_ha.replication_lines(repl_pw, master))
            return path

        master = servers.start_redis(folder / "master", config=conf("master", None))
        port = servers.free_port()
        replica = servers.start_redis(
            folder / "replica", port=port, config=conf("replica", ("127.0.0.1", master.port))
        )
        sentinels = []
        for i in range(3):
            sport = servers.free_port()
            path = folder / f"sentinel{i}.conf"
            path.write_text(
                redis_ha.sentinel_config(
                    sport,
                    ("127.0.0.1", master.port),
                    sent_pw,
                    service=SERVICE,
                    down_after_ms=down_after_ms,
                    failover_timeout_ms=3000,
                    data_dir=str(folder),
                )
            )
            argv = [str(servers.find_redis_server()), str(path), "--sentinel"]
            proc = servers.ManagedProcess(f"sentinel{i}", argv).start()
            proc.wait_port(sport)
            sentinels.append((sport, proc))
        topo = cls(master, replica, sentinels, repl_pw, sent_pw)
        topo.wait_ready()
        return topo

    def admin(self, server: servers.RunningServer) -> redis.Redis:
        """The harness's own login (every command) on one server."""
        return redis.Redis(
            port=server.port, username=TEST_USER, password=AUTH.test_password, socket_timeout=2
        )

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until the replica is in sync and every sentinel sees it and the two others."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.admin(self.replica).info("replication")
            ok = info.get("master_link_status") == "up"
            for port, _ in self.sentinels:
                s = redis.Redis(port=port, socket_timeout=1)
                ok = ok and len(s.sentinel_slaves(SERVICE)) == 1
                ok = ok and len(s.sentinel_sentinels(SERVICE)) == 2
            if ok:
                return
            time.sleep(0.2)
        raise AssertionError("the sentinel topology did not settle")

    def url(self, user: str | None = None, password: str | None = None) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port, _ in self.sentinels)
        auth = f"{user}:{password}@" if user else ""
        return f"redis+sentinel://{auth}{hosts}/{SERVICE}/0"

    def master_port(self) -> int:
        """The port of the master the first live sentinel names now."""
        for port, proc in self.sentinels:
            if proc.alive():
                _host, mport = redis.Redis(
                    port=port, socket_timeout=1
                ).sentinel_get_master_addr_by_name(SERVICE)
                return int(mport)
        raise AssertionError("no sentinel alive")

    def stop(self) -> None:
        for _, proc in self.sentinels:
            proc.stop(grace=2)
        for server in (self.master, self.replica):
            server.stop(grace=2)
