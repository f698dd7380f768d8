"""``loki``: run the embedded stack.

``loki up`` starts NATS, Redis, the engine supervisor (which launches llama-server with
``LOKI_MODEL``, by default the bundled SmolLM2), recall, perf, chat and the gateway on
loopback, prints the URL, and stops everything cleanly on Ctrl-C.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import typer
from rich.console import Console

from .stack import Stack, StackConfig, StackError

app = typer.Typer(add_completion=False, help="Loki, a self-hosted assistant around a local LLM.")
console = Console(stderr=True)


@app.command()
def up(
    wait_engine: bool = typer.Option(
        True, help="Wait for llama-server to be ready before printing the URL."
    ),
) -> None:
    """Run the whole stack in the foreground until Ctrl-C (or SIGTERM)."""
    config = StackConfig.from_environ()
    stack = Stack(config, log=lambda line: console.print(f"[bold cyan]loki[/] {line}"))
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        stack.start()
        if wait_engine:
            with console.status("waiting for llama-server to load the model…"):
                while not stopping:
                    info = stack.engine_info()
                    if info and info.get("state") in ("ready", "failed"):
                        break
                    stack.poll()
                    time.sleep(0.5)
            if info and info.get("state") == "failed":
                console.print(f"[red]engine failed:[/] {info.get('detail', '')}")
            elif info:
                model = Path(info.get("model") or "?").name
                console.print(f"engine ready: {model} (n_ctx {info.get('n_ctx')})")
        host = "127.0.0.1" if config.web_host in ("0.0.0.0", "::") else config.web_host
        console.print(
            f"\n[bold green]Loki is up:[/] http://{host}:{config.web_port}/   (Ctrl-C to stop)\n"
        )
        while not stopping:
            stack.poll()
            time.sleep(0.5)
    except StackError as exc:
        console.print(f"[red]cannot run Loki:[/] {exc}")
        raise typer.Exit(1) from exc
    finally:
        console.print("stopping…")
        stack.stop()


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


def main() -> None:
    app()
