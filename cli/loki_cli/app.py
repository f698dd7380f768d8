"""``loki``: run the embedded stack.

``loki up`` checks that the web port is free, starts NATS, Redis, the engine supervisor (which
launches llama-server with ``LOKI_MODEL``, by default the bundled SmolLM2), recall, memory,
perf, chat and the gateway on loopback, and prints "Loki is up" with the URL only once the
gateway it started answers there and the engine is ready. What cannot start is said in one
line, with exit status 1. Ctrl-C stops everything in order (NATS last); a second Ctrl-C stops
at once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import typer

from .backup_cmd import register as register_backup
from .e2e import register as register_e2e
from .stack import Stack, StackConfig, StackError
from .term import console, say

app = typer.Typer(add_completion=False, help="Loki, a self-hosted assistant around a local LLM.")

#: Exit status of ``loki up`` when Loki cannot start (or cannot go on).
EXIT_FAILED = 1
#: Exit status after a second Ctrl-C (everything killed at once).
EXIT_FORCED = 130


@app.command()
def up(
    wait_engine: bool = typer.Option(
        True, help="Wait for llama-server to be ready before printing the URL."
    ),
) -> None:
    """Run the whole stack in the foreground until Ctrl-C (or SIGTERM)."""
    config = StackConfig.from_environ()
    stack = Stack(config, log=lambda line: say(line, "loki", "bold cyan"))
    signals = 0

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            console.print("stopping… (Ctrl-C again to stop at once)")
            return
        console.print("stopping at once")
        stack.kill()
        os._exit(EXIT_FORCED)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    status = 0
    try:
        stack.preflight()
        stack.start()
        if wait_engine:
            with console.status("waiting for llama-server to load the model…"):
                info = stack.wait_engine(lambda: signals > 0)
            if info:
                model = Path(info.get("model") or "?").name
                say(f"{model} (n_ctx {info.get('n_ctx')})", "engine ready:")
        if not signals:
            stack.up = True
            console.print()
            say(f"{stack.url}   (Ctrl-C to stop)\n", "Loki is up:", "bold green")
        while not signals:
            stack.poll()
            time.sleep(0.5)
    except StackError as exc:
        if stack.up:
            say(exc, style="red")
        else:
            say(exc, "Loki cannot start:", "red")
        status = EXIT_FAILED
    finally:
        if stack.procs or stack.infra:
            if not signals:
                console.print("stopping…")
            stack.stop()
    raise typer.Exit(status)


@app.command()
def doctor() -> None:
    """Say which binaries and model Loki would use."""
    from loki_shared import servers

    for label, find in (
        ("nats-server", servers.find_nats_server),
        ("redis-server", servers.find_redis_server),
        ("llama-server", servers.find_llama_server),
        ("bundled model", servers.find_bundled_model),
    ):
        try:
            say(find(), f"{label:14}")
        except servers.ServerNotFound as exc:
            say(exc, f"{label:14} missing:", "red")


register_backup(app)
register_e2e(app)


def main() -> None:
    app()
