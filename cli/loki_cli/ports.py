"""Is a port free before anything starts, and who holds it when it is not.

The gateway binds ``LOKI_WEB_HOST:LOKI_WEB_PORT``; finding it taken before NATS, Redis and the
services start lets ``loki up`` say so in one line (the port, the variable to change, the
process holding it where the system tells) instead of a gateway failing to bind in a loop.
"""

from __future__ import annotations

import errno
import socket

import psutil


class PortInUse(RuntimeError):
    """A port Loki must listen on is taken; the message says which, by whom, what to change."""


def bind_error(host: str, port: int) -> OSError | None:
    """Try to bind ``host:port`` the way uvicorn does (``SO_REUSEADDR``, so a socket only in
    TIME_WAIT does not count); return the error, or None when the port is free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None


def holder(port: int) -> str | None:
    """``pid N (command line)`` of the process listening on TCP ``port``, when the system
    tells (another user's process is hidden from a non-root user); None when unknown."""
    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return None
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            if conn.pid is None:
                return None
            try:
                cmd = (
                    " ".join(psutil.Process(conn.pid).cmdline()) or psutil.Process(conn.pid).name()
                )
            except (psutil.Error, OSError):
                cmd = "?"
            return f"pid {conn.pid} ({cmd[:120]})"
    return None


def check_free(host: str, port: int, variable: str) -> None:
    """Raise when Loki cannot listen on ``host:port``; ``variable`` is the setting that
    chose the port (``LOKI_WEB_PORT``).

    Raises:
        PortInUse: the port is taken (the message names the holder when known), or ``host``
            is not an address of this machine.
    """
    exc = bind_error(host, port)
    if exc is None:
        return
    if exc.errno == errno.EADDRINUSE:
        who = holder(port)
        by = f" by {who}" if who else ""
        raise PortInUse(
            f"port {port} on {host} is already in use{by}: stop that program or set "
            f"{variable} to a free port"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        raise PortInUse(f"{host} is not an address of this machine (LOKI_WEB_HOST)")
    raise PortInUse(f"cannot listen on {host}:{port} ({variable}): {exc.strerror or exc}")


def listening_pid_owns(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself listens on TCP ``port`` (so an answer on that port comes
    from it, not from another program)."""
    try:
        proc = psutil.Process(pid)
        conns = proc.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)
