"""The engine's process, the llama-server the supervisor runs: launch it from a plan, wait for
``/health``, read ``/props``, restart a crashed engine with backoff, stop it cleanly; or follow
an engine already running (``LOKI_ENGINE_URL``); or point at an external preset (no engine).

State changes go to a callback (the service publishes them on ``loki.engine.state``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
import shutil
import signal
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loki_shared import servers
from loki_shared.messages.engine import EngineState, EngineStateName, TemplateProbe

from .errors import EngineStartError
from .preflight import check_model_file
from .probe import ProbeCache
from .routing import build_number

log = logging.getLogger("loki_supervisor.engine")  # the name of its logs, kept across the rename

StateCallback = Callable[[EngineState], Awaitable[None]]


@dataclass
class Props:
    """What ``/props`` (and ``/slots``, ``/v1/models``) say of a running engine."""

    total_slots: int = 0
    slot_n_ctx: list[int] = field(default_factory=list)
    build_info: str | None = None
    chat_template: str | None = None
    chat_template_caps: dict[str, Any] | None = None
    model: str = ""
    model_path: str | None = None
    #: ``/props`` ``modalities.vision``: the engine was given a vision projector.
    vision: bool = False


try:  # loaded in the parent: the child between fork and exec only calls prctl
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6", use_errno=True)
except OSError:  # not glibc Linux: no parent-death signal
    _LIBC = None

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _child_setup(parent_pid: int) -> Callable[[], None]:
    """The ``preexec_fn`` of an engine child: a clean start whatever the spawning thread held.

    - The signal mask is emptied: a mask survives fork and exec, so a signal blocked in the
      thread that spawned the engine would stay blocked in llama-server for its whole life
      (then neither a stop's SIGTERM nor a parent-death signal reaches it).
    - ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: the engine dies with its supervisor. SIGKILL, not
      SIGTERM: the supervisor's orderly stop already sends SIGTERM first; this signal is for a
      supervisor that died without stopping it, and llama-server's SIGTERM handler can hang
      (it takes a lock the interrupted thread may hold), which left orphans holding the port
      and the VRAM.
    - A supervisor that died between fork and the prctl is noticed (the parent pid changed)
      and the child exits at once.
    """

    def setup() -> None:  # pragma: no cover - runs in the child
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent_pid:
                os._exit(1)

    return setup


def auth_headers(api_key: str | None) -> dict[str, str]:
    """``Authorization: Bearer`` header for an engine key (empty when no key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def slot_action(
    client: httpx.AsyncClient,
    base_url: str,
    api_key: str | None,
    id_slot: int,
    action: str,
    filename: str,
    timeout: float,
) -> dict[str, Any]:
    """llama.cpp's ``POST /slots/{id_slot}?action=save|restore`` ``{"filename": ...}`` (a
    file under the engine's ``--slot-save-path``); returns the answer's JSON object
    (``n_saved``/``n_restored``, ``timings``; ``{}`` when it is not an object).

    Raises:
        RuntimeError: the engine answered another status than 200 (status and body start).
        httpx.HTTPError: the request failed or ran past ``timeout`` seconds.
    """
    r = await client.post(
        f"{base_url}/slots/{id_slot}",
        params={"action": action},
        json={"filename": filename},
        headers=auth_headers(api_key),
        timeout=timeout,
    )
    if r.status_code != 200:
        raise RuntimeError(f"{action} answered {r.status_code}: {r.text[:200]}")
    body = r.json()
    return body if isinstance(body, dict) else {}


async def read_props(client: httpx.AsyncClient, base_url: str, api_key: str | None) -> Props:
    """Read ``/props`` (``total_slots``, ``default_generation_settings.n_ctx``,
    ``build_info``, ``chat_template``, ``chat_template_caps``, ``model_path``,
    ``modalities.vision``), then
    ``/slots`` for the per-slot ``n_ctx`` when the engine exposes it, and ``/v1/models``
    for the model id.

    Raises:
        httpx.HTTPError: ``/props`` is unreachable or not 200.
    """
    headers = auth_headers(api_key)
    r = await client.get(f"{base_url}/props", headers=headers)
    r.raise_for_status()
    props: dict[str, Any] = r.json()
    total = int(props.get("total_slots") or 0)
    dgs = props.get("default_generation_settings") or {}
    n_ctx = int(dgs.get("n_ctx") or props.get("n_ctx") or 0)
    slot_ctx = [n_ctx] * total
    with contextlib.suppress(httpx.HTTPError, ValueError, TypeError):
        rs = await client.get(f"{base_url}/slots", headers=headers)
        if rs.status_code == 200 and isinstance(rs.json(), list):
            listed = [int(s.get("n_ctx") or 0) for s in rs.json()]
            if listed:
                slot_ctx = listed
                total = total or len(listed)
    model = ""
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        rm = await client.get(f"{base_url}/v1/models", headers=headers)
        if rm.status_code == 200:
            model = str(rm.json()["data"][0]["id"])
    model_path = props.get("model_path")
    caps = props.get("chat_template_caps")
    modalities = props.get("modalities")
    vision = isinstance(modalities, dict) and modalities.get("vision") is True
    if not model and model_path:
        model = Path(str(model_path)).name
    return Props(
        total_slots=total,
        slot_n_ctx=slot_ctx,
        build_info=props.get("build_info"),
        chat_template=props.get("chat_template"),
        chat_template_caps=caps if isinstance(caps, dict) else None,
        model=model,
        model_path=str(model_path) if model_path else None,
        vision=vision,
    )


def prepare_slot_dir(
    path: Path, keep: Callable[[str], bool] | None = None, shared: bool = False
) -> None:
    """Create ``path`` with mode 0700 and empty it (slot files of a previous engine are
    stale: another model or another launch), except the plain files whose name ``keep``
    accepts (SLOT_PERSIST's files: their own rules delete them). ``shared``: the pool's
    ``LOKI_ENGINE_SLOT_DIR``, which other engines (other users, other machines) read and
    write: created 0700 when missing, its mode left as the operator set it otherwise."""
    existed = path.is_dir()
    path.mkdir(parents=True, exist_ok=True)
    if not (shared and existed):
        os.chmod(path, 0o700)
    for child in path.iterdir():
        if keep is not None and keep(child.name) and child.is_file() and not child.is_symlink():
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                child.unlink()


class EngineProcess:
    """One llama-server child process: spawn, drain its output into a tail, wait, stop.

    Args:
        argv: the full command line (binary first).
        tail_lines: how many output lines to keep for error reports.
    """

    def __init__(self, argv: list[str], tail_lines: int = 40, env: dict[str, str] | None = None):
        self.argv = argv
        self.env = env
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self.proc: asyncio.subprocess.Process | None = None
        self._drain: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Spawn the process (stdout and stderr merged into the tail)."""
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self.env,
            preexec_fn=_child_setup(os.getpid()),
        )
        self._drain = asyncio.create_task(self._read(), name="llama-server-output")

    async def _read(self) -> None:
        assert self.proc and self.proc.stdout
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()
            self.tail.append(text)
            log.debug("[llama-server] %s", text)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def wait(self) -> int:
        """Wait for the process to exit; return its exit status."""
        assert self.proc
        rc = await self.proc.wait()
        if self._drain:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._drain, 2)
        return rc

    async def stop(self, grace: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        if not self.alive():
            return
        assert self.proc
        with contextlib.suppress(ProcessLookupError):
            self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), grace)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        if self._drain:
            self._drain.cancel()


@dataclass
class LaunchSpec:
    """What the runner launches: the argv without the binary, the port, the key, the slot
    directory to prepare. Built by the service from a :class:`~loki_supervisor.plan.LaunchPlan`."""

    args: list[str]
    host: str
    port: int
    api_key: str | None
    slot_dir: Path | None
    binary: Path
    auto_port: bool = False  # port chosen by the supervisor: take another if it is taken
    model: Path | None = None  # checked before every launch (preflight.check_model_file)
    model_source: str = "LOKI_MODEL"  # where the model path came from, for messages
    keep_slot_file: Callable[[str], bool] | None = None  # SLOT_PERSIST: kept at launch
    slot_dir_shared: bool = False  # the pool's LOKI_ENGINE_SLOT_DIR: its mode is not ours


class EngineRunner:
    """Keeps one configuration of the engine alive until :meth:`stop`.

    Modes: ``launch`` (a :class:`LaunchSpec`), ``follow`` (``LOKI_ENGINE_URL``: poll
    ``/health``), ``external`` (an external preset: ready at once, no engine).

    A launch that fails before the engine was ever healthy with this configuration (the
    model file check, an exit while starting, ``/health`` not ok in time) is final: state
    ``failed`` with ``retry_in_s`` None, the reason in ``detail`` and the engine's last output
    lines in ``stderr_tail``; it would fail the same way again, so only applying a preset
    (the same one after a fix, or another) launches again. A crash after a healthy start is
    restarted with backoff (``retry_in_s`` says when).

    Before a launched or followed engine is said ``ready``, its chat template is probed
    (:mod:`loki_supervisor.probe`, cached by template hash): ``template`` holds the verdicts
    (None for an external API, or until the first probe).

    Args:
        on_state: awaited on every state change.
        start_timeout: seconds ``/health`` has to answer 200 after a spawn.
        backoff_max: longest wait between restarts (doubling from 1 s, reset after the
            engine stayed ready for 60 s).
        probes: the template probe cache (shared across launches; a new one by default).
    """

    def __init__(
        self,
        on_state: StateCallback,
        start_timeout: float = 300.0,
        backoff_max: float = 30.0,
        probes: ProbeCache | None = None,
    ) -> None:
        self.on_state = on_state
        self.start_timeout = start_timeout
        self.backoff_max = backoff_max
        self.state: EngineStateName = "stopped"
        self.detail = ""
        self.stderr_tail: list[str] = []
        self.retry_in_s: float | None = None
        self.props = Props()
        self.base_url = ""
        self.api_key: str | None = None
        self.external = False
        self.restarts = 0
        self.build_hint: int | None = None
        self.process: EngineProcess | None = None
        self.notes: list[str] = []
        self.probes = probes or ProbeCache()
        self.template: TemplateProbe | None = None
        self._task: asyncio.Task[None] | None = None
        self._client = httpx.AsyncClient(timeout=5.0)

    # ------------------------------------------------------------------ state
    async def _set(
        self,
        state: EngineStateName,
        detail: str = "",
        tail: list[str] | None = None,
        retry_in_s: float | None = None,
    ) -> None:
        self.state = state
        self.detail = detail
        self.stderr_tail = list(tail or [])
        self.retry_in_s = retry_in_s
        if state == "failed":
            log.error("engine failed: %s", detail)
            for line in self.stderr_tail[-5:]:
                log.error("  [llama-server] %s", line)
        else:
            log.info("engine %s%s", state, f": {detail}" if detail else "")
        event = EngineState(
            state=state,
            ts=time.time(),
            detail=detail,
            stderr_tail=self.stderr_tail,
            retry_in_s=retry_in_s,
            notes=list(self.notes),
            base_url=self.base_url,
            external=self.external,
        )
        try:
            await self.on_state(event)
        except Exception:  # a state event is news, not control: a failed publish never stops it
            log.exception("publishing engine state failed")

    @property
    def build(self) -> int | None:
        """llama.cpp build: from ``/props`` ``build_info``, else the packaging's
        (:func:`~loki_supervisor.facts.package_build`) for a launched engine; None: unknown."""
        return build_number(self.props.build_info) or self.build_hint

    # ------------------------------------------------------------------ modes
    async def run_launch(self, spec: LaunchSpec, notes: list[str]) -> None:
        """Start keeping ``spec`` alive (returns once the runner task is started)."""
        await self.stop()
        self.notes = list(notes)
        self.external = False
        self.api_key = spec.api_key
        self.base_url = f"http://{_url_host(spec.host)}:{spec.port}"
        self._task = asyncio.create_task(self._launch_loop(spec), name="engine-launch")

    async def run_follow(self, url: str, api_key: str | None) -> None:
        """Follow the engine at ``url`` (nothing launched)."""
        await self.stop()
        self.build_hint = None
        self.notes = [f"following the engine at {url}"]
        self.external = False
        self.api_key = api_key
        self.base_url = url.rstrip("/")
        self._task = asyncio.create_task(self._follow_loop(), name="engine-follow")

    async def run_external(self, base_url: str, api_key: str | None, model: str) -> None:
        """Point at an external OpenAI-compatible API: no local engine runs."""
        await self.stop()
        self.build_hint = None
        self.notes = []
        self.external = True
        self.api_key = api_key
        root = base_url.rstrip("/")
        self.base_url = root[:-3] if root.endswith("/v1") else root
        self.props = Props(model=model)
        self.template = None
        await self._set("ready", f"external API {self.base_url}")

    async def stop(self) -> None:
        """Stop the current mode: the engine process is terminated (SIGTERM, then SIGKILL)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.process is not None:
            await self.process.stop()
            self.process = None
        if self.state != "stopped":
            await self._set("stopped")
        self.props = Props()
        self.template = None

    async def close(self) -> None:
        await self.stop()
        await self._client.aclose()

    def kill(self) -> None:
        """SIGKILL the engine now, if one runs (a stop that ran out of time)."""
        process = self.process
        if process is not None and process.proc is not None and process.alive():
            with contextlib.suppress(ProcessLookupError):
                process.proc.kill()

    # ------------------------------------------------------------------ loops
    async def _launch_loop(self, spec: LaunchSpec) -> None:
        backoff = 1.0
        healthy_once = False  # this configuration has served: a later exit is a crash
        port_retries = 0
        first = True
        while True:
            if not first:
                self.restarts += 1
            first = False
            await self._set("starting", " ".join(_mask(spec.args)))
            ready_at: float | None = None
            try:
                if spec.model is not None:
                    await asyncio.to_thread(check_model_file, spec.model, spec.model_source)
                await self._spawn_and_wait(spec)
                healthy_once = True
                ready_at = time.monotonic()
                await self._set("ready")
                assert self.process is not None
                rc = await self.process.wait()
                tail = list(self.process.tail)[-15:]
                raise EngineStartError(f"llama-server exited with status {rc}", tail)
            except EngineStartError as exc:
                if self.process is not None:
                    await self.process.stop()
                self.props = Props()
                if (
                    ready_at is None
                    and spec.auto_port
                    and port_retries < 3
                    and _bind_failed(exc.tail)
                ):
                    # Our own pick of a free port was taken meanwhile: pick another.
                    port_retries += 1
                    self._move_port(spec, servers.free_port())
                    continue
                if exc.permanent or not healthy_once:
                    await self._set(
                        "failed", f"{exc} (not retried: fix it, then apply a preset)", exc.tail
                    )
                    return
                if ready_at is not None and time.monotonic() - ready_at > 60:
                    backoff = 1.0
                await self._set(
                    "failed", f"{exc}; restart in {backoff:g} s", exc.tail, retry_in_s=backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(self.backoff_max, backoff * 2)

    def _move_port(self, spec: LaunchSpec, port: int) -> None:
        spec.port = port
        i = spec.args.index("--port")
        spec.args[i + 1] = str(port)
        self.base_url = f"http://{_url_host(spec.host)}:{port}"

    async def _spawn_and_wait(self, spec: LaunchSpec) -> None:
        if spec.slot_dir is not None:
            prepare_slot_dir(spec.slot_dir, spec.keep_slot_file, spec.slot_dir_shared)
        probe = spec.host if spec.host not in ("0.0.0.0", "::") else "127.0.0.1"
        if servers.port_open(probe, spec.port):
            if not spec.auto_port:
                raise EngineStartError(
                    f"port {spec.port} is already in use (LOKI_ENGINE_PORT)", permanent=True
                )
            self._move_port(spec, servers.free_port())
        self.process = EngineProcess([str(spec.binary), *spec.args])
        try:
            await self.process.start()
        except OSError as exc:
            raise EngineStartError(f"cannot run {spec.binary}: {exc}", permanent=True) from exc
        deadline = time.monotonic() + self.start_timeout
        while True:
            if not self.process.alive():
                rc = await self.process.wait()
                tail = list(self.process.tail)[-15:]
                why = telling_line(tail)
                raise EngineStartError(
                    f"llama-server exited with status {rc} while starting"
                    + (f": {why}" if why else ""),
                    tail,
                )
            if time.monotonic() > deadline:
                raise EngineStartError(
                    f"/health not ok within {self.start_timeout:g} s", list(self.process.tail)[-15:]
                )
            try:
                r = await self._client.get(
                    f"{self.base_url}/health", headers=auth_headers(self.api_key)
                )
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.25)
        try:
            self.props = await read_props(self._client, self.base_url, self.api_key)
        except (httpx.HTTPError, ValueError) as exc:
            raise EngineStartError(
                f"/props unreadable: {exc}", list(self.process.tail)[-15:]
            ) from exc
        await self.probe()

    async def probe(self) -> None:
        """Probe the ready engine's chat template (cached by its hash) into ``template``.
        Never raises: a probe that cannot run leaves verdicts None with its ``error``."""
        self.template = await self.probes.get(
            self._client,
            self.base_url,
            self.api_key,
            template=self.props.chat_template,
            model=self.props.model,
            caps=self.props.chat_template_caps,
        )

    async def _follow_loop(self) -> None:
        while True:
            healthy = False
            try:
                r = await self._client.get(
                    f"{self.base_url}/health", headers=auth_headers(self.api_key)
                )
                healthy = r.status_code == 200
                why = f"/health answered {r.status_code}"
            except httpx.HTTPError as exc:
                why = f"/health unreachable: {exc.__class__.__name__}"
            if healthy and self.state != "ready":
                try:
                    self.props = await read_props(self._client, self.base_url, self.api_key)
                    await self.probe()
                    await self._set("ready", f"engine at {self.base_url}")
                except (httpx.HTTPError, ValueError) as exc:
                    await self._set("failed", f"/props unreadable: {exc}")
            elif not healthy and self.state != "failed":
                self.props = Props()
                await self._set("failed", why, retry_in_s=1.0)
            await asyncio.sleep(2.0 if self.state == "ready" else 1.0)

    # ------------------------------------------------------------------ slots
    async def slot0_idle(self) -> bool | None:
        """Whether slot 0 is idle per ``/slots`` (``is_processing`` false); None: unknown."""
        try:
            r = await self._client.get(
                f"{self.base_url}/slots", headers=auth_headers(self.api_key), timeout=1.0
            )
            if r.status_code != 200:
                return None
            for slot in r.json():
                if int(slot.get("id", -1)) == 0:
                    return not bool(slot.get("is_processing"))
        except (httpx.HTTPError, ValueError, TypeError):
            return None
        return None

    async def erase_slot(self, slot: int = 0, timeout: float = 2.0) -> str | None:
        """``POST /slots/<slot>?action=erase`` (llama.cpp; needs ``--slot-save-path``),
        bounded to ``timeout`` seconds. Returns None on success, else why it failed."""
        try:
            r = await self._client.post(
                f"{self.base_url}/slots/{slot}",
                params={"action": "erase"},
                headers=auth_headers(self.api_key),
                timeout=timeout,
            )
        except httpx.HTTPError as exc:
            return f"erase failed: {exc.__class__.__name__}"
        if r.status_code != 200:
            return f"erase answered {r.status_code}: {r.text[:200]}"
        return None


#: llama.cpp's log line prefix: ``<time> <level letter> `` (``0.00.007.005 E ...``).
_LOG_PREFIX = re.compile(r"^\d+(?:\.\d+){3} ([A-Z]) ")
#: Words of an unprefixed output line that says why it stopped (argument errors are printed
#: as ``error: invalid argument: ...``).
_TELLING = re.compile(r"error|failed|invalid|unknown|cannot|couldn't|unable", re.IGNORECASE)


def telling_line(tail: list[str]) -> str:
    """The output line that best says why llama-server stopped: the first error line (the
    cause comes before its consequences: "this GGUF file is version ..." before "failed to
    load model" and "exiting due to model loading error"), without llama.cpp's time and
    level prefix; else the last non-empty line; "" for no output."""
    lines = [line.strip() for line in tail if line.strip()]
    for line in lines:
        m = _LOG_PREFIX.match(line)
        if m is not None:
            if m.group(1) == "E":
                return " ".join(line[m.end() :].split())[:300]
        elif _TELLING.search(line):
            return line[:300]
    return lines[-1][:300] if lines else ""


def _bind_failed(tail: list[str]) -> bool:
    """Whether llama-server's output says it could not bind its port (cpp-httplib's
    "couldn't bind HTTP server socket")."""
    return any("couldn't bind" in line or "address already in use" in line.lower() for line in tail)


def _mask(args: list[str]) -> list[str]:
    out: list[str] = []
    hide = False
    for a in args:
        out.append("***" if hide else a)
        hide = a == "--api-key"
    return out


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
