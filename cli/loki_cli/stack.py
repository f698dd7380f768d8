"""The embedded stack: NATS, Redis and the seven services as child processes on loopback.

:class:`Stack` checks the ports it must listen on (:meth:`Stack.preflight`), starts the parts
in dependency order (NATS and Redis first and ready, then the engine supervisor — which
launches llama-server —, recall, memory, perf, workspace, chat, and the gateway last), and
stops everything in reverse order, NATS last. Data lives under ``LOKI_HOME``: Redis's
append-only file in ``redis/``, JetStream in ``nats/``, so conversations, the archive and the
perf ring survive a restart of the whole stack.

The embedded NATS and Redis require a login (issue 22): the passwords are generated once into
``LOKI_HOME/credentials.json`` (0600, :func:`loki_shared.credentials.ensure`), nats-server runs
with the per-user permissions of :mod:`loki_shared.permissions` (``LOKI_HOME/run/nats.conf``)
and Redis with one ACL user per service (``LOKI_HOME/run/redis.conf``); each service gets only
its own NATS user (``LOKI_NATS_USER`` / ``LOKI_NATS_PASSWORD``) and Redis user
(``LOKI_REDIS_USER`` / ``LOKI_REDIS_PASSWORD``). With
``LOKI_NATS_URL`` / ``LOKI_REDIS_URL`` the servers are someone else's: their credentials come
from the environment as it is.

What it says is true (issue 27): the stack is *up* when the gateway process it started
itself listens on the port and answers ``/healthz`` (:meth:`Stack.wait_gateway`); a service
that exits before the stack is up is a start failure, said with the service's own last
words, not restarted; one that dies after is restarted with backoff (:meth:`Stack.poll`).

Every child runs in a session of its own, so a terminal's Ctrl-C reaches only the launcher,
which then stops them in order (each within ``LOKI_STOP_TIMEOUT_S``).

The launcher is ours rather than honcho's because start-up must be sequenced on readiness
(a service started before NATS listens would fail its first connect); it reuses
:class:`loki_shared.servers.ManagedProcess`, the same process wrapper the tests use.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loki_shared import credentials, permissions, servers

from . import ports, runfile

#: (name, python module), in start order.
SERVICES: list[tuple[str, str]] = [
    ("engine-supervisor", "loki_supervisor"),
    ("recall", "loki_recall"),
    ("memory", "loki_memory"),
    ("perf", "loki_perf"),
    ("workspace", "loki_workspace"),
    ("chat", "loki_chat"),
    ("gateway", "loki_gateway"),
]

#: Seconds the launcher waits past a service's own stop budget before SIGKILL.
KILL_MARGIN_S = 2.0


class StackError(RuntimeError):
    """The stack could not start or cannot go on; the message is one line for a person."""


@dataclass
class StackConfig:
    """Where the stack keeps its data and how it is reached.

    ``nats_url`` / ``redis_url`` set: use those servers instead of starting embedded ones.
    ``env`` is passed to every service on top of the inherited ``LOKI_*`` variables;
    ``service_env`` (service name -> variables) to one service only, on top of ``env``.
    ``nats_login``: ``nats.connect`` options the launcher itself logs in with to an external
    NATS (it asks ``loki.engine.info``); the embedded one's come from ``LOKI_HOME``.
    ``stop_timeout_s``: each service's stop budget (``LOKI_STOP_TIMEOUT_S``).
    """

    home: Path
    web_port: int = 8090
    web_host: str = "127.0.0.1"
    nats_url: str | None = None
    redis_url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    service_env: dict[str, dict[str, str]] = field(default_factory=dict)
    nats_login: dict[str, Any] = field(default_factory=dict)
    echo: bool = True
    stop_timeout_s: float = 10.0

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> StackConfig:
        """Read ``LOKI_HOME`` (default ``./data``), ``LOKI_WEB_PORT`` (8090),
        ``LOKI_WEB_HOST``, ``LOKI_NATS_URL``, ``LOKI_REDIS_URL``, ``LOKI_STOP_TIMEOUT_S`` (10).

        Raises:
            ValueError: ``LOKI_WEB_PORT`` or ``LOKI_STOP_TIMEOUT_S`` is not a number.
        """
        environ = dict(os.environ if environ is None else environ)
        return cls(
            home=Path(environ.get("LOKI_HOME", "./data")).resolve(),
            web_port=int(environ.get("LOKI_WEB_PORT", "8090")),
            web_host=environ.get("LOKI_WEB_HOST", "127.0.0.1"),
            nats_url=environ.get("LOKI_NATS_URL") or None,
            redis_url=environ.get("LOKI_REDIS_URL") or None,
            stop_timeout_s=float(environ.get("LOKI_STOP_TIMEOUT_S", "10")),
        )


class Stack:
    """Runs the stack described by a :class:`StackConfig`.

    Typical use: ``stack.preflight(); stack.start(); stack.wait_engine_ready(); ...;
    stack.stop()``. ``log`` receives one line per lifecycle event (default: stderr).
    """

    def __init__(self, config: StackConfig, log: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.log = log or (lambda line: print(f"[loki] {line}", file=sys.stderr, flush=True))
        self.infra: dict[str, servers.ManagedProcess] = {}
        self.procs: dict[str, servers.ManagedProcess] = {}
        self.nats_url = config.nats_url or ""
        self.redis_url = config.redis_url or ""
        #: The embedded servers' passwords (None until :meth:`start`, or with both external).
        self.creds: credentials.Credentials | None = None
        self.up = False
        self._restarts: dict[str, tuple[int, float]] = {}

    # -- environment ---------------------------------------------------------------------
    def service_env(self, name: str | None = None) -> dict[str, str]:
        """The environment service ``name`` gets (every service's when None): with embedded
        servers, its own NATS user and its own Redis user."""
        env = dict(os.environ)
        env.update(
            LOKI_HOME=str(self.config.home),
            LOKI_NATS_URL=self.nats_url,
            LOKI_REDIS_URL=self.redis_url,
            LOKI_WEB_PORT=str(self.config.web_port),
            LOKI_WEB_HOST=self.config.web_host,
            LOKI_STOP_TIMEOUT_S=f"{self.config.stop_timeout_s:g}",
            PYTHONUNBUFFERED="1",
        )
        env.setdefault("LOKI_PERF_METRICS_PORT", str(servers.free_port()))
        env.update(self.config.env)
        if name is not None:
            env.update(self.config.service_env.get(name, {}))
        if name is not None and self.creds is not None:
            login = credentials.service_env(self.creds, name)
            if not self.config.nats_url:
                env.update(LOKI_NATS_USER=name, LOKI_NATS_PASSWORD=login["LOKI_NATS_PASSWORD"])
            if not self.config.redis_url:
                env.update(LOKI_REDIS_USER=name, LOKI_REDIS_PASSWORD=login["LOKI_REDIS_PASSWORD"])
        return env

    def nats_login(self, user: str = "cli") -> dict[str, Any]:
        """``nats.connect`` keyword arguments logging ``user`` in to the embedded NATS; for an
        external one, :attr:`StackConfig.nats_login` (empty: its URL says how, if at all)."""
        if self.config.nats_url:
            return dict(self.config.nats_login)
        if self.creds is None:
            return {}
        return {
            "user": user,
            "password": self.creds.nats[user],
            "inbox_prefix": permissions.inbox_prefix(user),
        }

    # -- start ---------------------------------------------------------------------------
    def preflight(self) -> None:
        """Check, before anything starts, that the ports Loki must listen on are free: the
        gateway's (``LOKI_WEB_PORT``), and ``LOKI_PERF_METRICS_PORT`` / ``LOKI_ENGINE_PORT``
        when they are set.

        Raises:
            StackError: a port is taken (the message names it, the variable to change and,
                where the system tells, the process holding it).
        """
        env = {**os.environ, **self.config.env}
        wanted = [(self.config.web_host, self.config.web_port, "LOKI_WEB_PORT")]
        for variable, host_var in (
            ("LOKI_PERF_METRICS_PORT", "LOKI_PERF_METRICS_HOST"),
            ("LOKI_ENGINE_PORT", "LOKI_ENGINE_HOST"),
        ):
            if env.get(variable, "").strip().isdigit() and int(env[variable]) > 0:
                host = env.get(host_var) or ("0.0.0.0" if "PERF" in variable else "127.0.0.1")
                wanted.append((host, int(env[variable]), variable))
        for host, port, variable in wanted:
            try:
                ports.check_free(host, port, variable)
            except ports.PortInUse as exc:
                raise StackError(str(exc)) from exc

    def start(self) -> None:
        """Start NATS and Redis (unless external), then every service, the gateway last;
        return when the gateway this stack started answers on its port.

        Raises:
            StackError: a binary is missing, or a process exited or did not become ready
                (the message carries its last words).
        """
        home = self.config.home
        home.mkdir(parents=True, exist_ok=True)
        echo = self.config.echo
        try:
            if not (self.config.nats_url and self.config.redis_url):
                self.creds = credentials.ensure(home)
            if not self.config.nats_url:
                assert self.creds is not None
                conf = credentials.write_nats_config(home / credentials.NATS_CONF, self.creds)
                nats = servers.start_nats(home / "nats", echo=echo, own_session=True, config=conf)
                self.infra["nats"] = nats.process
                self.nats_url = nats.url
                self.log(f"NATS (JetStream) on {self.nats_url}")
            if not self.config.redis_url:
                assert self.creds is not None
                conf = credentials.write_redis_config(home / credentials.REDIS_CONF, self.creds)
                redis = servers.start_redis(
                    home / "redis", echo=echo, own_session=True, config=conf
                )
                self.infra["redis"] = redis.process
                self.redis_url = redis.url
                self.log(f"Redis (append-only) on {self.redis_url}")
            runfile.write(home, self.nats_url, self.redis_url)
            for name, _ in SERVICES:
                self.start_service(name)
            self.wait_gateway()
        except (
            servers.ServerNotFound,
            servers.ServerStartError,
            StackError,
            credentials.CredentialsError,
        ) as exc:
            self.stop()
            raise StackError(str(exc)) from exc

    def start_service(self, name: str) -> servers.ManagedProcess:
        """Start service ``name`` (``python -m <module>``) with :meth:`service_env`."""
        module = dict(SERVICES)[name]
        proc = servers.ManagedProcess(
            name,
            [sys.executable, "-m", module],
            env=self.service_env(name),
            echo=self.config.echo,
            own_session=True,
        ).start()
        self.procs[name] = proc
        self.log(f"started {name} (pid {proc.proc.pid if proc.proc else '?'})")
        return proc

    def stop_service(self, name: str, kill: bool = False) -> None:
        """Stop service ``name``: SIGTERM, SIGKILL past its stop budget (or at once with
        ``kill``)."""
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if kill:
            proc.kill()
        else:
            proc.stop(grace=self.config.stop_timeout_s + KILL_MARGIN_S)
        self.log(f"stopped {name}")

    def restart_service(self, name: str) -> servers.ManagedProcess:
        self.stop_service(name)
        return self.start_service(name)

    # -- readiness -----------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The gateway's address as printed to a person (loopback for a wildcard bind)."""
        return f"http://{_connect_host(self.config.web_host)}:{self.config.web_port}/"

    def wait_gateway(self, timeout: float = 60.0) -> None:
        """Return when the gateway process this stack started listens on the port itself and
        ``GET /healthz`` there answers 200.

        Raises:
            StackError: a service exited meanwhile, or ``timeout`` seconds passed.
        """
        gateway = self.procs["gateway"]
        port = self.config.web_port
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_starting()
            pid = gateway.proc.pid if gateway.proc else -1
            if ports.listening_pid_owns(pid, port) and _healthz_ok(self.url + "healthz"):
                return
            time.sleep(0.1)
        raise StackError(
            f"the gateway did not answer on {self.url} within {timeout:.0f} s: "
            + last_words(gateway)
        )

    def check_starting(self) -> None:
        """While starting: a service that exited is a start failure (it would fail the same
        way again: a port taken, a bad setting).

        Raises:
            StackError: ``<service> exited while starting (status N): <its last error line>``.
        """
        for name, proc in [*self.infra.items(), *self.procs.items()]:
            if not proc.alive():
                code = proc.proc.returncode if proc.proc else "?"
                raise StackError(
                    f"{name} exited while starting (status {code}): {last_words(proc)}"
                )

    def engine_info(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """Ask ``loki.engine.info`` over NATS; None when nobody answers yet."""
        import asyncio

        import nats as nats_client

        from loki_shared import subjects
        from loki_shared.nats import nats_servers

        async def ask() -> dict[str, Any] | None:
            nc = await nats_client.connect(
                nats_servers(self.nats_url),
                connect_timeout=timeout,
                allow_reconnect=False,
                **self.nats_login(),
            )
            try:
                msg = await nc.request(subjects.ENGINE_INFO, b"{}", timeout=timeout)
                return json.loads(msg.data)
            except Exception:  # noqa: BLE001 - any failure means "no answer yet"
                return None
            finally:
                await nc.close()

        try:
            return asyncio.run(ask())
        except Exception:  # noqa: BLE001 - NATS down or not up yet: no answer
            return None

    def services_answering(self, timeout: float = 2.0) -> bool:
        """Whether every service this stack runs but the gateway (checked on ``/healthz``)
        answers its health subject over NATS (``loki.health.<service>``): a service that is
        still importing or connecting does not, and a request to it would find no responder."""
        import asyncio

        from loki_shared import health

        names = [name for name in self.procs if name != "gateway"]

        async def ask_all() -> bool:
            for name in names:
                try:
                    await health.ask_nats(self.nats_url, name, None, timeout, self.nats_login())
                except (health.NoResponder, RuntimeError):
                    return False
            return True

        return asyncio.run(ask_all())

    def wait_engine(self, stopping: Callable[[], bool] = lambda: False) -> dict[str, Any] | None:
        """Block until the supervisor reports the engine ``ready`` and every service answers
        (:meth:`services_answering`), and return the engine's info; None when ``stopping()``
        became true first. A failure that the supervisor retries (a crash after a healthy
        start) is waited through; a final one is not.

        Raises:
            StackError: the engine failed for good (the supervisor's reason), or a service
                exited while starting.
        """
        while not stopping():
            self.check_starting()
            info = self.engine_info()
            if info and info.get("state") == "ready" and self.services_answering():
                return info
            if info and info.get("state") == "failed" and info.get("retry_in_s") is None:
                raise StackError(engine_failure(info))
            time.sleep(0.5)
        return None

    def wait_engine_ready(self, timeout: float = 180.0) -> dict[str, Any]:
        """Block until the supervisor reports the engine ``ready``; return its info.

        Raises:
            StackError: ``timeout`` seconds passed, or the engine failed for good.
        """
        deadline = time.monotonic() + timeout
        info = self.wait_engine(lambda: time.monotonic() > deadline)
        if info is None:
            raise StackError(f"engine not ready after {timeout:.0f} s: {self.engine_info()}")
        return info

    # -- supervision ---------------------------------------------------------------------
    def poll(self) -> None:
        """Once up: restart any service that died, with a backoff of 1, 2, 4 ... 30 s.
        Before (:attr:`up` false): a service that died is a start failure.

        Raises:
            StackError: NATS or Redis died (the stack cannot go on without them), or a
                service exited while starting.
        """
        for name, proc in self.infra.items():
            if not proc.alive():
                raise StackError(f"{name} exited: {last_words(proc)}")
        if not self.up:
            self.check_starting()
            return
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
                f"{name} exited (code {proc.proc.returncode if proc.proc else '?'}): "
                f"{last_words(proc)}; restarting, next backoff {delay:.0f} s"
            )
            self._restarts[name] = (count + 1, now + delay)
            self.start_service(name)

    def stop(self) -> None:
        """Stop every service in reverse start order, then Redis and NATS (NATS last)."""
        runfile.remove(self.config.home)
        for name, _ in reversed(SERVICES):
            self.stop_service(name)
        for name in ("redis", "nats"):
            proc = self.infra.pop(name, None)
            if proc is not None:
                proc.stop(grace=self.config.stop_timeout_s + KILL_MARGIN_S)
                self.log(f"stopped {name}")

    def kill(self) -> None:
        """SIGKILL every child now (a second Ctrl-C); llama-server follows its supervisor
        (parent-death signal)."""
        for proc in [*self.procs.values(), *self.infra.values()]:
            proc.kill()
        self.procs.clear()
        self.infra.clear()


def engine_failure(info: dict[str, Any]) -> str:
    """One line for a person from a failed engine's info: the supervisor's reason, and how to
    reach the web UI when the failing configuration is a stored preset."""
    line = f"the engine failed: {info.get('detail') or 'no reason given'}"
    if info.get("preset_id") not in (None, "", "env"):
        line += (
            " — `loki up --no-wait-engine` starts Loki anyway, to pick another preset in the web UI"
        )
    return line


def last_words(proc: servers.ManagedProcess) -> str:
    """The line of a process's output that best says why it stopped: the exception line of
    its last Python traceback, else its first ERROR/CRITICAL log line (the cause comes before
    "startup failed"), else its last line."""
    lines = [line.rstrip() for line in proc.tail if line.strip()]
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    if starts:
        after = [line for line in lines[starts[-1] + 1 :] if not line[:1].isspace()]
        exceptions = [line for line in after if _EXCEPTION_LINE.match(line)]
        if exceptions:
            return exceptions[-1].strip()[:300]
    for line in lines:
        if _ERROR_RECORD.search(line):
            return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else "no output"


#: ``ValueError: ...``, ``nats.errors.NoServersError: ...`` (a traceback's last line).
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")
#: A log record at ERROR or CRITICAL in Loki's format (``<time> ERROR <service> ...``).
_ERROR_RECORD = re.compile(r"\s(ERROR|CRITICAL)\s")


#: No proxy for loopback checks, whatever the environment's ``http_proxy`` says.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _healthz_ok(url: str) -> bool:
    try:
        with _DIRECT.open(url, timeout=1) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _connect_host(bind_host: str) -> str:
    return "127.0.0.1" if bind_host in ("0.0.0.0", "", "::") else bind_host
