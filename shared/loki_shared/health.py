"""Container health checks for every service, and the responder each service attaches.

The gateway and the perf service have HTTP (``GET /healthz``, ``GET /metrics``); chat, recall
and the engine supervisor only speak NATS. So every service instance answers a NATS health
subject (:func:`loki_shared.subjects.health`), and this module is also a command, run inside
the service's container by Docker's ``HEALTHCHECK`` / compose's ``healthcheck``::

    python -m loki_shared.health chat                 # NATS: this container's chat instance
    python -m loki_shared.health --any recall         # NATS: any recall instance
    python -m loki_shared.health --http http://127.0.0.1:8090/healthz
    python -m loki_shared.health --process loki_chat  # a process runs ``-m loki_chat``
    python -m loki_shared.health chat --fallback-process loki_chat

``--fallback-process`` is for a service that does not answer its health subject yet: when NATS
says nobody at all subscribes to the subject ("no responders"), a live process running
``-m MODULE`` counts as healthy instead. A timeout or an ``ok: false`` answer never falls back.

Exit status 0 = healthy, 1 = unhealthy (one line on stderr says why), 2 = usage error. The
NATS URL and login come from ``LOKI_NATS_URL``, ``LOKI_NATS_USER`` / ``LOKI_NATS_PASSWORD`` (or
``LOKI_SECRETS_DIR``), as the service's own; the instance token is this host's name (a container's
host name is its id, so the check asks *this* container's instance, not a sibling replica).

A service attaches the responder to its broker before starting it::

    broker = make_broker(settings.nats_url, "chat", login=settings.nats_options())
    health.attach(broker, "chat", check=my_async_check)   # check is optional
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import subjects
from .messages.health import HealthReply, HealthRequest
from .serve import serve

if TYPE_CHECKING:  # pragma: no cover
    from faststream.nats import NatsBroker

#: An optional extra check: returns ``{}`` when healthy, else ``{"part": "why"}``.
Check = Callable[[], Awaitable[dict[str, str]]]

DEFAULT_TIMEOUT_S = 3.0


class NoResponder(RuntimeError):
    """Nobody subscribes to the health subject (the service has not attached a responder,
    or is not connected)."""


def instance_token(hostname: str | None = None) -> str:
    """This instance's subject token: the host name with every character outside
    ``[A-Za-z0-9_-]`` replaced by ``_`` (so an FQDN stays one token)."""
    name = hostname if hostname is not None else socket.gethostname()
    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "unknown"


def attach(broker: NatsBroker, service: str, check: Check | None = None) -> None:
    """Make ``broker`` answer ``loki.health.<service>.<instance>`` and, in queue group
    ``health``, ``loki.health.<service>``, with a :class:`HealthReply`
    (:func:`loki_shared.serve.serve`, the types named: these subjects are built per service).

    Call before the broker starts. ``check`` (optional) runs on each request; a non-empty
    dict it returns, or an exception it raises, makes the reply ``ok: false``.
    """
    instance = instance_token()

    async def answer(_: HealthRequest) -> HealthReply:
        detail: dict[str, str] = {}
        if check is not None:
            try:
                detail = dict(await check())
            except Exception as exc:  # noqa: BLE001 - a failing check is an unhealthy answer, not a crash
                detail = {"check": f"{type(exc).__name__}: {exc}"}
        return HealthReply(service=service, instance=instance, ok=not detail, detail=detail)

    # subjects built per service and instance: not in EXCHANGES, their types are named here
    for subject, queue in (
        (subjects.health(service, instance), ""),
        (subjects.health(service), subjects.QUEUE_HEALTH),
    ):
        serve(broker, subject, answer, queue=queue, request=HealthRequest, reply=HealthReply)


async def ask_nats(
    nats_url: str,
    service: str,
    instance: str | None,
    timeout: float = DEFAULT_TIMEOUT_S,
    login: dict[str, Any] | None = None,
) -> HealthReply:
    """Request the health subject over NATS and return the parsed reply. ``login``: the
    NATS user to log in as (``LokiSettings.nats_options()``); the CLI uses the container's own.

    Raises:
        NoResponder: nobody subscribes to the subject.
        RuntimeError: NATS unreachable, timeout, or an unreadable reply.
    """
    import nats
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    from .nats import nats_servers

    async def quiet(_exc: Exception) -> None:  # errors are reported once, below
        return None

    try:
        nc = await asyncio.wait_for(
            nats.connect(
                nats_servers(nats_url),
                connect_timeout=timeout,
                max_reconnect_attempts=0,
                allow_reconnect=False,
                error_cb=quiet,
                **(login or {}),
            ),
            timeout=timeout + 0.5,
        )
    except Exception as exc:  # any connect failure means unreachable, said as such
        raise RuntimeError(f"NATS {nats_url} unreachable: {type(exc).__name__}: {exc}") from exc
    subject = subjects.health(service, instance)
    try:
        msg = await nc.request(subject, b"{}", timeout=timeout)
    except NoRespondersError as exc:
        raise NoResponder(f"no responder on {subject}") from exc
    except NatsTimeout as exc:
        raise RuntimeError(f"no answer on {subject} within {timeout:g} s") from exc
    finally:
        await nc.close()
    try:
        return HealthReply.model_validate_json(msg.data)
    except ValueError as exc:
        raise RuntimeError(f"unreadable reply on {subject}: {msg.data[:200]!r}") from exc


def check_http(url: str, timeout: float = DEFAULT_TIMEOUT_S) -> str:
    """GET ``url``; return a short description when the status is 2xx.

    Raises:
        RuntimeError: connection failed, timed out, or the status is not 2xx.
    """
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{url}: HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise RuntimeError(f"{url}: {exc}") from exc


def check_process(module: str, proc_root: Path = Path("/proc")) -> int:
    """Return the pid of a live process whose command line runs ``-m <module>``.

    Raises:
        RuntimeError: none found (zombies are not alive).
    """
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        for i, arg in enumerate(argv[:-1]):
            if arg == b"-m" and argv[i + 1] == module.encode():
                return int(entry.name)
    raise RuntimeError(f"no live process runs -m {module}")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 healthy, 1 not, 2 usage)."""
    parser = argparse.ArgumentParser(
        prog="python -m loki_shared.health", description="Health check of a Loki service."
    )
    parser.add_argument("service", nargs="?", help="service name answered over NATS")
    parser.add_argument("--any", action="store_true", help="any instance, not this host's")
    parser.add_argument("--http", metavar="URL", help="GET this URL instead; 2xx is healthy")
    parser.add_argument("--process", metavar="MODULE", help="a live process runs -m MODULE")
    parser.add_argument(
        "--fallback-process",
        metavar="MODULE",
        help="when nobody subscribes to the health subject, a live -m MODULE process is healthy",
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds")
    args = parser.parse_args(argv)
    chosen = [bool(args.service), bool(args.http), bool(args.process)]
    if sum(chosen) != 1:
        parser.print_usage(sys.stderr)
        print("give exactly one of SERVICE, --http URL, --process MODULE", file=sys.stderr)
        return 2
    try:
        if args.http:
            what = check_http(args.http, args.timeout)
        elif args.process:
            what = f"pid {check_process(args.process)}"
        else:
            from .settings import LokiSettings

            settings = LokiSettings()  # LOKI_NATS_URL / _USER / _PASSWORD, LOKI_SECRETS_DIR
            instance = None if args.any else instance_token()
            try:
                reply = asyncio.run(
                    ask_nats(
                        settings.nats_url,
                        args.service,
                        instance,
                        args.timeout,
                        login=settings.nats_options(),
                    )
                )
            except NoResponder as exc:
                if not args.fallback_process:
                    raise
                pid = check_process(args.fallback_process)
                print(f"{exc}; process fallback: pid {pid}")
                return 0
            if not reply.ok:
                raise RuntimeError(
                    f"{reply.service}/{reply.instance} unhealthy: " + json.dumps(reply.detail)
                )
            what = f"{reply.service}/{reply.instance} ok"
    except RuntimeError as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    print(what)
    return 0


if __name__ == "__main__":
    sys.exit(main())
