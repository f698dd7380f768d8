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
from rich.console import Console

from .backup_cmd import register as register_backup
from .stack import Stack, StackConfig, StackError

app = typer.Typer(add_completion=False, help="Loki, a self-hosted assistant around a local LLM.")
console = Console(stderr=True, soft_wrap=True)

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
    stack = Stack(config, log=lambda line: console.print(f"[bold cyan]loki[/] {line}"))
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
                console.print(f"engine ready: {model} (n_ctx {info.get('n_ctx')})")
        if not signals:
            stack.up = True
            console.print(f"\n[bold green]Loki is up:[/] {stack.url}   (Ctrl-C to stop)\n")
        while not signals:
            stack.poll()
            time.sleep(0.5)
    except StackError as exc:
        console.print(f"[red]Loki cannot start:[/] {exc}" if not stack.up else f"[red]{exc}[/]")
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
            console.print(f"{label:14} {find()}")
        except servers.ServerNotFound as exc:
            console.print(f"{label:14} [red]missing[/]: {exc}")


register_backup(app)


def main() -> None:
    app()
