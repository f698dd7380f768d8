"""The embedded stack: NATS, Redis and the five services as child processes on loopback.

:class:`Stack` starts them in dependency order (NATS and Redis first and ready, then the
engine supervisor — which launches llama-server —, recall, perf, chat, and the gateway last),
restarts a service that dies, and stops everything in reverse order. Data lives under
``LOKI_HOME``: Redis's append-only file in ``redis/``, JetStream in ``nats/``, so
conversations, the archive and the perf ring survive a restart of the whole stack.

The launcher is ours rather than honcho's because start-up must be sequenced on readiness
(a service started before NATS listens would fail its first connect); it reuses
:class:`loki_shared.servers.ManagedProcess`, the same process wrapper the tests use.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loki_shared import servers

#: (name, python module), in start order.
SERVICES: list[tuple[str, str]] = [
    ("engine-supervisor", "loki_supervisor"),
    ("recall", "loki_recall"),
    ("perf", "loki_perf"),
    ("chat", "loki_chat"),
    ("gateway", "loki_gateway"),
]


class StackError(RuntimeError):
    """The stack could not start: a server is missing or did not become ready."""


@dataclass
class StackConfig:
    """Where the stack keeps its data and how it is reached.

    ``nats_url`` / ``redis_url`` set: use those servers instead of starting embedded ones.
    ``env`` is passed to every service on top of the inherited ``LOKI_*`` variables.
    """

    home: Path
    web_port: int = 8090
    web_host: str = "127.0.0.1"
    nats_url: str | None = None
    redis_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    echo: bool = True

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> StackConfig:
        """Read ``LOKI_HOME`` (default ``./data``), ``LOKI_WEB_PORT`` (8090),
        ``LOKI_WEB_HOST``, ``LOKI_NATS_URL``, ``LOKI_REDIS_URL``.

        Raises:
            ValueError: ``LOKI_WEB_PORT`` is not an integer.
        """
        environ = dict(os.environ if environ is None else environ)
        return cls(
            home=Path(environ.get("LOKI_HOME", "./data")).resolve(),
            web_port=int(environ.get("LOKI_WEB_PORT", "8090")),
            web_host=environ.get("LOKI_WEB_HOST", "127.0.0.1"),
            nats_url=environ.get("LOKI_NATS_URL") or None,
            redis_url=environ.get("LOKI_REDIS_URL") or None,
        )


class Stack:
    """Runs the stack described by a :class:`StackConfig`.

    Typical use: ``stack.start(); stack.wait_engine_ready(); ...; stack.stop()``.
    ``log`` receives one line per lifecycle event (default: stderr).
    """

    def __init__(self, config: StackConfig, log: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.log = log or (lambda line: print(f"[loki] {line}", file=sys.stderr, flush=True))
        self.infra: dict[str, servers.ManagedProcess] = {}
        self.procs: dict[str, servers.ManagedProcess] = {}
        self.nats_url = config.nats_url or ""
        self.redis_url = config.redis_url or ""
        self._restarts: dict[str, tuple[int, float]] = {}

    # -- environment ---------------------------------------------------------------------
    def service_env(self) -> dict[str, str]:
        """The environment every service process gets."""
        env = dict(os.environ)
        env.update(
            LOKI_HOME=str(self.config.home),
            LOKI_NATS_URL=self.nats_url,
            LOKI_REDIS_URL=self.redis_url,
            LOKI_WEB_PORT=str(self.config.web_port),
            LOKI_WEB_HOST=self.config.web_host,
            PYTHONUNBUFFERED="1",
        )
        env.setdefault("LOKI_PERF_METRICS_PORT", str(servers.free_port()))
        env.update(self.config.env)
        return env

    # -- start ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start NATS and Redis (unless external), then every service, the gateway last;
        return when the gateway listens.

        Raises:
            StackError: a binary is missing or a process did not become ready.
        """
        home = self.config.home
        home.mkdir(parents=True, exist_ok=True)
        try:
            if not self.config.nats_url:
                port = servers.free_port()
                (home / "nats").mkdir(exist_ok=True)
                proc = servers.ManagedProcess(
                    "nats", servers.nats_command(port, home / "nats"), echo=self.config.echo
                ).start()
                self.infra["nats"] = proc
                proc.wait_port(port)
                self.nats_url = f"nats://127.0.0.1:{port}"
                self.log(f"NATS (JetStream) on {self.nats_url}")
            if not self.config.redis_url:
                port = servers.free_port()
                (home / "redis").mkdir(exist_ok=True)
                proc = servers.ManagedProcess(
                    "redis", servers.redis_command(port, home / "redis"), echo=self.config.echo
                ).start()
                self.infra["redis"] = proc
                proc.wait_port(port)
                self.redis_url = f"redis://127.0.0.1:{port}/0"
                self.log(f"Redis (append-only) on {self.redis_url}")
            for name, _ in SERVICES:
                self.start_service(name)
            self.procs["gateway"].wait_port(
                self.config.web_port, timeout=60, host=_connect_host(self.config.web_host)
            )
        except (servers.ServerNotFound, servers.ServerStartError) as exc:
            self.stop()
            raise StackError(str(exc)) from exc

    def start_service(self, name: str) -> servers.ManagedProcess:
        """Start service ``name`` (``python -m <module>``) with :meth:`service_env`."""
        module = dict(SERVICES)[name]
        proc = servers.ManagedProcess(
            name, [sys.executable, "-m", module], env=self.service_env(), echo=self.config.echo
        ).start()
        self.procs[name] = proc
        self.log(f"started {name} (pid {proc.proc.pid if proc.proc else '?'})")
        return proc

    def stop_service(self, name: str, kill: bool = False) -> None:
        """Stop service ``name``: SIGTERM (or SIGKILL with ``kill``)."""
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        proc.kill() if kill else proc.stop()
        self.log(f"stopped {name}")

    def restart_service(self, name: str) -> servers.ManagedProcess:
        self.stop_service(name)
        return self.start_service(name)

    # -- readiness -----------------------------------------------------------------------
    def engine_info(self, timeout: float = 2.0) -> dict | None:
        """Ask ``loki.engine.info`` over NATS; None when nobody answers yet."""
        import asyncio

        import nats as nats_client

        from loki_shared import subjects

        async def ask() -> dict | None:
            nc = await nats_client.connect(self.nats_url, connect_timeout=timeout)
            try:
                msg = await nc.request(subjects.ENGINE_INFO, b"{}", timeout=timeout)
                import json

                return json.loads(msg.data)
            except Exception:  # noqa: BLE001 - any failure means "no answer yet"
                return None
            finally:
                await nc.close()

        try:
            return asyncio.run(ask())
        except Exception:  # noqa: BLE001 - NATS down or not up yet: no answer
            return None

    def wait_engine_ready(self, timeout: float = 180.0) -> dict:
        """Block until the supervisor reports the engine ``ready``; return its info.

        Raises:
            StackError: ``timeout`` seconds passed, or the engine failed.
        """
        deadline = time.monotonic() + timeout
        info: dict | None = None
        while time.monotonic() < deadline:
            info = self.engine_info()
            if info and info.get("state") == "ready":
                return info
            time.sleep(0.5)
        raise StackError(f"engine not ready after {timeout:.0f} s: {info}")

    # -- supervision ---------------------------------------------------------------------
    def poll(self) -> None:
        """Restart any service that died, with a backoff of 1, 2, 4 ... 30 s.

        Raises:
            StackError: NATS or Redis died (the stack cannot go on without them).
        """
        for name, proc in self.infra.items():
            if not proc.alive():
                raise StackError(f"{name} exited: " + " | ".join(list(proc.tail)[-5:]))
        now = time.monotonic()
        for name in list(self.procs):
            proc = self.procs[name]
            if proc.alive():
                continue
            count, not_before = self._restarts.get(name, (0, 0.0))
            if now < not_before:
                continue
            delay = min(30.0, 2.0**count)
            self.log(
                f"{name} exited (code {proc.proc.returncode if proc.proc else '?'}); "
                f"restarting, next backoff {delay:.0f} s"
            )
            self._restarts[name] = (count + 1, now + delay)
            self.start_service(name)

    def stop(self) -> None:
        """Stop every service in reverse start order, then Redis and NATS."""
        for name, _ in reversed(SERVICES):
            self.stop_service(name)
        for name in ("redis", "nats"):
            proc = self.infra.pop(name, None)
            if proc is not None:
                proc.stop()
                self.log(f"stopped {name}")


def _connect_host(bind_host: str) -> str:
    return "127.0.0.1" if bind_host in ("0.0.0.0", "", "::") else bind_host
