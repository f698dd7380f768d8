"""Pure launch rules: preset + GPU facts + GGUF facts + host RAM + engine help → the engine's
command line, notes for a person, the SIDE_SLOT verdict and the CACHE_RAM value.

Nothing here touches the system; :mod:`loki_supervisor.facts` reads the facts and
:mod:`loki_supervisor.engine_process` runs the result. Every rule has a table test in
``tests/engine/test_plan.py``.
"""

from __future__ import annotations

import ipaddress
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .cache_reuse import DEFAULT_CACHE_REUSE, cache_reuse_args
from .draft import DraftRequest, DraftVerdict, draft_bytes, draft_verdict, memory_refusal
from .facts import MIB, EngineHelp, GgufFacts, GpuFacts, HostMemory

#: llama-server's default ``--cache-ram`` (MiB); CACHE_RAM auto never goes below it.
ENGINE_DEFAULT_CACHE_RAM_MIB = 8192
#: Default number of context checkpoints when the engine's help does not say.
DEFAULT_CTX_CHECKPOINTS = 8
#: SIDE_SLOT: model + two KV states must fit in this share of VRAM (or available RAM).
SIDE_SLOT_MEMORY_SHARE = 0.90
#: CACHE_RAM auto: KV of one CTX window times this factor.
CACHE_RAM_KV_FACTOR = 2.5
CACHE_RAM_RAM_SHARE = 0.30
CACHE_RAM_FREE_SHARE = 0.50

#: Options that fix the slot layout themselves: SIDE_SLOT refuses when one is given.
SIDE_SLOT_CONFLICT_FLAGS = (
    "-c",
    "--ctx-size",
    "-np",
    "--parallel",
    "-kvu",
    "--kv-unified",
    "--no-kv-unified",
    "-no-kvu",
    "--kv-unified-per-slot",
    "--cache-idle-slots",
    "--no-cache-idle-slots",
)
#: Their environment variables (llama.cpp ``LLAMA_ARG_*``), besides those the help lists.
SIDE_SLOT_CONFLICT_ENV = (
    "LLAMA_ARG_CTX_SIZE",
    "LLAMA_ARG_N_PARALLEL",
    "LLAMA_ARG_KV_UNIFIED",
    "LLAMA_ARG_NO_KV_UNIFIED",
    "LLAMA_ARG_KV_UNIFIED_PER_SLOT",
    "LLAMA_ARG_CACHE_IDLE_SLOTS",
)
_NGL_FLAGS = ("-ngl", "--gpu-layers", "--n-gpu-layers")
_CPU_WEIGHT_FLAGS = (
    "-ot",
    "--override-tensor",
    "-cmoe",
    "--cpu-moe",
    "-ncmoe",
    "--n-cpu-moe",
    "-ncffn",
    "--n-cpu-ffn",
)
_NO_KV_OFFLOAD_FLAGS = ("-nkvo", "--no-kv-offload")
_CACHE_RAM_FLAGS = ("-cram", "--cache-ram")
_TEMPLATE_FLAGS = ("--chat-template", "--chat-template-file")
_NGL_ALL = {"", "auto", "all", "999", "-1"}


def truthy(value: str | None, default: bool = False) -> bool:
    """Feature-key truth: ``on``/``1``/``true``/``yes`` (any case) → True; ``off``/``0``/
    ``false``/``no`` → False; empty or None → ``default``."""
    if value is None or not str(value).strip():
        return default
    return str(value).strip().lower() in {"on", "1", "true", "yes"}


def tristate(value: str | None) -> bool | None:
    """A feature key the chat service applies (``VERIFY``): None when empty or absent (the
    chat's own setting decides), else :func:`truthy`."""
    if value is None or not str(value).strip():
        return None
    return truthy(value)


@dataclass(frozen=True)
class LocalConfig:
    """A local preset resolved for one launch.

    ``ngl``: None/"auto"/"all"/"999" or a layer count (text). ``parallel``: PARALLEL or None.
    ``ubatch``: UBATCH (``--ubatch-size``, tokens) or None.
    ``extra_args``: EXTRA_ARGS, shell-quoted text. ``cache_ram``: CACHE_RAM text.
    ``slot_dir``: ``LOKI_HOME/slots``. ``draft``: the draft model fields
    (speculative decoding, :mod:`loki_supervisor.draft`). ``chat_template_file``:
    CHAT_TEMPLATE_FILE, a Jinja chat template used instead of the GGUF's ("": the GGUF's).
    ``mmproj``: the preset's MMPROJ feature, a vision projector GGUF path (empty: none).
    ``tail_reuse``: COMPACT_TAIL_REUSE; ``cache_reuse``: CACHE_REUSE, ``--cache-reuse``'s
    chunk (tokens; :mod:`loki_supervisor.cache_reuse`).
    """

    model: Path
    ctx: int = 8192
    ngl: str | None = None
    parallel: int | None = None
    ubatch: int | None = None
    extra_args: str = ""
    side_slot: bool = False
    cache_ram: str = ""
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    threads: int | None = None
    slot_dir: Path | None = None
    draft: DraftRequest = field(default_factory=DraftRequest)
    chat_template_file: str = ""
    mmproj: str = ""
    tail_reuse: bool = False
    cache_reuse: int = DEFAULT_CACHE_REUSE


@dataclass(frozen=True)
class Facts:
    """Everything the rules read, injected (tests build it by hand)."""

    gguf: GgufFacts | None
    gpu: GpuFacts
    host: HostMemory
    help: EngineHelp
    env: Mapping[str, str] = field(default_factory=dict)
    #: GPU devices the engine build lists (``[]``: CPU-only build; None: unknown).
    engine_devices: list[str] | None = None
    #: The draft model's GGUF facts (None: no draft asked, or unreadable).
    draft_gguf: GgufFacts | None = None
    #: Why the draft's vocabulary differs from the model's (None: the same, or no draft).
    draft_vocab: str | None = None


@dataclass(frozen=True)
class CacheRam:
    """The CACHE_RAM decision. ``value_mib``: what ``--cache-ram`` gets (None: the flag is
    not passed). ``effective_mib``: what the engine will use when known (the value, or the
    engine default when the flag is absent and nothing else sets it). ``need_mib``/``cap_mib``:
    the auto arithmetic when computed. ``reason``: why, for a person."""

    value_mib: int | None
    effective_mib: int | None
    need_mib: int | None = None
    cap_mib: int | None = None
    reason: str = ""

    def as_dict(self) -> dict[str, object]:
        return {
            "value_mib": self.value_mib,
            "effective_mib": self.effective_mib,
            "need_mib": self.need_mib,
            "cap_mib": self.cap_mib,
            "default_mib": ENGINE_DEFAULT_CACHE_RAM_MIB,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class LaunchPlan:
    """The result of :func:`plan_launch`.

    ``args``: llama-server arguments (without the binary). ``slots``: ``-np`` passed;
    ``slot_ctx``: tokens per slot (CTX). ``side_slot``: SIDE_SLOT accepted;
    ``side_slot_refusal``: why it was refused (None when not asked or accepted).
    ``placement``: ``gpu`` (all weights and KV on GPU), ``cpu`` (CPU-only engine),
    ``split`` (weights on CPU with a GPU present or partial NGL), ``unknown``.
    ``shared_window``: the slots share one KV pool (unified cache) — never routed.
    """

    args: list[str]
    notes: list[str]
    slots: int
    slot_ctx: int
    side_slot: bool
    side_slot_refusal: str | None
    placement: str
    cache_ram: CacheRam
    slot_save_path: Path | None
    shared_window: bool
    side_slot_bytes: int | None = None
    draft: DraftVerdict = field(default_factory=DraftVerdict)

    def masked_args(self) -> list[str]:
        """``args`` with the value of ``--api-key`` replaced by ``***``."""
        out: list[str] = []
        hide = False
        for a in self.args:
            out.append("***" if hide else a)
            hide = a == "--api-key"
        return out


# ----------------------------------------------------------------------------- helpers
def split_args(extra: str) -> list[str]:
    """EXTRA_ARGS as argv tokens (shell quoting rules).

    Raises:
        ValueError: unbalanced quotes.
    """
    return shlex.split(extra or "")


def arg_names(tokens: list[str]) -> set[str]:
    """Option names present in ``tokens`` (``--x=1`` counts as ``--x``)."""
    return {t.split("=", 1)[0] for t in tokens if t.startswith("-") and not _is_number(t)}


def arg_value(tokens: list[str], *names: str) -> str | None:
    """Value of the LAST occurrence of any of ``names`` in ``tokens`` (llama.cpp keeps the
    last one), ``--x=v`` or ``--x v``; None when absent."""
    value = None
    for i, t in enumerate(tokens):
        name, eq, inline = t.partition("=")
        if name in names:
            if eq:
                value = inline
            elif i + 1 < len(tokens):
                value = tokens[i + 1]
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost``."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def mib(n_bytes: float) -> int:
    """Bytes → MiB, rounded up."""
    return int(math.ceil(n_bytes / MIB))


def ctx_checkpoints(tokens: list[str], help_: EngineHelp) -> int:
    """Context checkpoints per slot: EXTRA_ARGS ``--ctx-checkpoints``/``-ctxcp``, else the
    default the help text states, else :data:`DEFAULT_CTX_CHECKPOINTS`."""
    value = arg_value(tokens, "--ctx-checkpoints", "-ctxcp", "--swa-checkpoints")
    if value is not None and value.isdigit():
        return int(value)
    m = re.search(r"--ctx-checkpoints[^\n]*(?:\n[ \t]+[^\n]*)*?default:\s*(\d+)", help_.text)
    return int(m.group(1)) if m else DEFAULT_CTX_CHECKPOINTS


def cache_types(tokens: list[str], env: Mapping[str, str]) -> tuple[str, str]:
    """KV cache types (``-ctk``/``-ctv``, their ``LLAMA_ARG_*``), default f16."""
    k = arg_value(tokens, "-ctk", "--cache-type-k") or env.get("LLAMA_ARG_CACHE_TYPE_K") or "f16"
    v = arg_value(tokens, "-ctv", "--cache-type-v") or env.get("LLAMA_ARG_CACHE_TYPE_V") or "f16"
    return k.lower(), v.lower()


@dataclass(frozen=True)
class Placement:
    """Where the weights go. ``kind``: gpu / cpu / split / unknown; ``ngl_arg``: the ``-ngl``
    value to pass; ``imposed``: NGL set to a number by the person; ``kv_on_cpu``: KV kept in
    RAM (``--no-kv-offload``); ``why``: for a person."""

    kind: str
    ngl_arg: str
    imposed: bool
    kv_on_cpu: bool
    why: str


def placement(cfg: LocalConfig, facts: Facts, tokens: list[str]) -> Placement:
    """Decide where weights and KV live from NGL, EXTRA_ARGS, the engine's devices and NVML.

    Rules: NGL unset/``auto``/``all``/``999`` → ``-ngl auto`` when the engine's help knows
    ``auto`` (current llama.cpp), else ``999``; a number is imposed (warned) and passed as
    is; ``-ngl`` in EXTRA_ARGS wins (it comes last). No GPU at all (the engine build lists
    no device, or NVML knows zero GPUs) → CPU-only engine (``-ngl 0`` when NGL is unset).
    A layer count below ``block_count + 1``, ``--cpu-moe``/``-ncmoe``/``-ot`` with a GPU →
    weights split. NGL 0 without a known GPU is a CPU-only engine.
    """
    ngl_text = (arg_value(tokens, *_NGL_FLAGS) or cfg.ngl or "").strip().lower()
    kv_on_cpu = bool(arg_names(tokens) & set(_NO_KV_OFFLOAD_FLAGS)) or truthy(
        facts.env.get("LLAMA_ARG_NO_KV_OFFLOAD")
    )
    if facts.engine_devices is not None:
        gpu_present: bool | None = len(facts.engine_devices) > 0
    elif facts.gpu.known:
        gpu_present = len(facts.gpu.gpus) > 0
    else:
        gpu_present = None
    imposed = ngl_text not in _NGL_ALL
    if imposed:
        try:
            ngl_n = int(ngl_text)
        except ValueError:
            ngl_n = None
    else:
        ngl_n = None
    auto_arg = "auto" if facts.help.ngl_auto else "999"

    if gpu_present is False:
        arg = ngl_text if imposed else "0"
        return Placement("cpu", arg, imposed, kv_on_cpu, "no GPU: CPU-only engine")
    if imposed and ngl_n == 0:
        if gpu_present:
            return Placement("split", "0", True, True, "NGL 0: weights on CPU beside a GPU")
        return Placement("cpu", "0", True, True, "NGL 0: CPU-only engine")
    arg = ngl_text if imposed else auto_arg
    cpu_weights = arg_names(tokens) & set(_CPU_WEIGHT_FLAGS)
    if cpu_weights:
        return Placement(
            "split",
            arg,
            imposed,
            kv_on_cpu,
            f"{', '.join(sorted(cpu_weights))} in EXTRA_ARGS: weights on CPU",
        )
    if imposed and ngl_n is not None and facts.gguf is not None:
        if ngl_n < facts.gguf.block_count + 1:
            return Placement(
                "split",
                arg,
                True,
                kv_on_cpu,
                f"NGL {ngl_n} of {facts.gguf.block_count + 1} layers: weights on CPU",
            )
    if imposed and (ngl_n is None or facts.gguf is None):
        return Placement("unknown", arg, True, kv_on_cpu, f"NGL {ngl_text}: placement unknown")
    if gpu_present is None:
        return Placement("unknown", arg, imposed, kv_on_cpu, "GPU unknown (no NVML)")
    return Placement("gpu", arg, imposed, kv_on_cpu, "all layers on GPU")


# --------------------------------------------------------------------------- SIDE_SLOT
def side_slot_verdict(
    cfg: LocalConfig, facts: Facts, tokens: list[str], place: Placement, draft_size: int = 0
) -> tuple[str | None, str | None, int | None]:
    """Decide SIDE_SLOT. Returns ``(refusal, note, second_slot_bytes)``: ``refusal`` is None
    when accepted (then ``note`` is the VRAM/RAM note).

    Refused (the launch stays on one slot with the line it would have without SIDE_SLOT) if:
    PARALLEL set and not 2; ``-c``/``-np``/``-kvu``/``--no-kv-unified``/
    ``--kv-unified-per-slot``/``--cache-idle-slots`` in EXTRA_ARGS or their ``LLAMA_ARG_*``
    set; the engine's help lacks ``--no-kv-unified``; GGUF unknown; weights on CPU beside a
    GPU (or placement unknown); VRAM (GPU) or available RAM (CPU-only engine) unknown;
    model + two KV states (+ a draft model and its two KV states, ``draft_size`` bytes) above
    90% of it.
    """
    if cfg.parallel is not None and cfg.parallel != 2:
        return f"PARALLEL={cfg.parallel}: SIDE_SLOT needs PARALLEL unset or 2", None, None
    clash = sorted(arg_names(tokens) & set(SIDE_SLOT_CONFLICT_FLAGS))
    if clash:
        return f"{' '.join(clash)} in EXTRA_ARGS: SIDE_SLOT sets the slot layout itself", None, None
    env_names = set(SIDE_SLOT_CONFLICT_ENV) | set(facts.help.env_of(*SIDE_SLOT_CONFLICT_FLAGS))
    env_clash = sorted(n for n in env_names if facts.env.get(n, "") != "")
    if env_clash:
        return f"{' '.join(env_clash)} set: SIDE_SLOT sets the slot layout itself", None, None
    if not facts.help.has("--no-kv-unified"):
        return "the engine has no --no-kv-unified (update llama.cpp)", None, None
    if facts.gguf is None:
        return "GGUF facts unknown: the second slot's size cannot be checked", None, None
    if place.kind == "split":
        return f"{place.why}: SIDE_SLOT needs every layer on GPU", None, None
    if place.kind == "unknown":
        return f"{place.why}: the second slot's memory cannot be checked", None, None
    ctk, ctv = cache_types(tokens, facts.env)
    state = facts.gguf.kv_bytes(cfg.ctx, ctk, ctv) + facts.gguf.recurrent_state_bytes()
    need = facts.gguf.file_size + 2 * state + draft_size
    if place.kind == "gpu":
        room, what = facts.gpu.total, "VRAM"
    else:
        room, what = facts.host.available, "available RAM"
    if room is None:
        return f"{what} unknown: the second slot's size cannot be checked", None, None
    limit = SIDE_SLOT_MEMORY_SHARE * room
    with_draft = f" + draft {mib(draft_size)} MiB" if draft_size else ""
    figures = (
        f"model {mib(facts.gguf.file_size)} MiB + 2 × {mib(state)} MiB KV{with_draft}"
        f" = {mib(need)} MiB of {mib(room)} MiB {what}"
    )
    if need > limit:
        return f"{figures}: above 90%", None, None
    return None, f"SIDE_SLOT on: second slot uses {mib(state)} MiB ({figures})", state


# --------------------------------------------------------------------------- CACHE_RAM
def cache_ram_decision(
    cfg: LocalConfig, facts: Facts, tokens: list[str], place: Placement
) -> CacheRam:
    """Decide ``--cache-ram`` (MiB).

    - ``-cram``/``--cache-ram`` in EXTRA_ARGS or ``LLAMA_ARG_CACHE_RAM`` set → Loki stays
      silent (no flag).
    - The engine's help does not list ``--cache-ram`` → no flag.
    - A number (including -1: no limit, 0: off) → passed as is.
    - Empty/``auto`` → never below the engine default (8192 MiB); raised only for an
      all-GPU model (known NVIDIA VRAM, no weights or KV on CPU, full NGL) to
      ``2.5 × KV(CTX) + recurrent state × (1 + checkpoints)`` (hybrid/recurrent models),
      capped at ``min(30% of RAM (cgroup limit included), 50% of available RAM)``.

    Raises:
        ValueError: CACHE_RAM is neither empty, ``auto`` nor an integer ≥ -1.
    """
    text = (cfg.cache_ram or "").strip().lower()
    explicit: int | None = None
    if text not in ("", "auto"):
        try:
            explicit = int(text)
        except ValueError as exc:
            raise ValueError(
                f"CACHE_RAM={cfg.cache_ram!r}: empty, auto, or MiB (-1, 0, N)"
            ) from exc
        if explicit < -1:
            raise ValueError(f"CACHE_RAM={explicit}: -1 (no limit), 0 (off) or a size in MiB")
    in_args = arg_value(tokens, *_CACHE_RAM_FLAGS)
    if in_args is not None or (arg_names(tokens) & set(_CACHE_RAM_FLAGS)):
        eff = int(in_args) if in_args and in_args.lstrip("-").isdigit() else None
        return CacheRam(None, eff, reason="set in EXTRA_ARGS (-cram)")
    if facts.env.get("LLAMA_ARG_CACHE_RAM", "") != "":
        raw = facts.env["LLAMA_ARG_CACHE_RAM"]
        eff = int(raw) if raw.lstrip("-").isdigit() else None
        return CacheRam(None, eff, reason="set by LLAMA_ARG_CACHE_RAM")
    if not facts.help.has(*_CACHE_RAM_FLAGS):
        return CacheRam(None, None, reason="the engine has no --cache-ram")
    if explicit is not None:
        return CacheRam(explicit, explicit, reason="CACHE_RAM set")
    default = CacheRam(None, ENGINE_DEFAULT_CACHE_RAM_MIB, reason="")
    if not (place.kind == "gpu" and facts.gpu.known and facts.gpu.gpus):
        return CacheRam(
            None,
            default.effective_mib,
            reason=f"engine default: not an all-GPU model on known NVIDIA VRAM ({place.why})",
        )
    if place.kv_on_cpu:
        return CacheRam(None, default.effective_mib, reason="engine default: KV on CPU")
    if facts.gguf is None:
        return CacheRam(None, default.effective_mib, reason="engine default: GGUF unknown")
    ctk, ctv = cache_types(tokens, facts.env)
    recurrent = facts.gguf.recurrent_state_bytes()
    ckpt = ctx_checkpoints(tokens, facts.help) if recurrent else 0
    need = CACHE_RAM_KV_FACTOR * facts.gguf.kv_bytes(cfg.ctx, ctk, ctv) + recurrent * (1 + ckpt)
    need_mib = mib(need)
    if facts.host.total is None or facts.host.available is None:
        return CacheRam(
            None, default.effective_mib, need_mib, reason="engine default: host RAM unknown"
        )
    cap_mib = int(
        min(CACHE_RAM_RAM_SHARE * facts.host.total, CACHE_RAM_FREE_SHARE * facts.host.available)
        // MIB
    )
    value = min(need_mib, cap_mib)
    if value <= ENGINE_DEFAULT_CACHE_RAM_MIB:
        why = "need fits the default" if need_mib <= ENGINE_DEFAULT_CACHE_RAM_MIB else "RAM cap"
        return CacheRam(
            None, ENGINE_DEFAULT_CACHE_RAM_MIB, need_mib, cap_mib, reason=f"engine default ({why})"
        )
    return CacheRam(
        value,
        value,
        need_mib,
        cap_mib,
        reason=f"auto: 2.5 × KV at CTX{' + recurrent state and checkpoints' if recurrent else ''}",
    )


# ---------------------------------------------------------------------- CHAT_TEMPLATE_FILE
def chat_template_args(
    cfg: LocalConfig, help_: EngineHelp, tokens: list[str]
) -> tuple[list[str], str | None]:
    """CHAT_TEMPLATE_FILE (a GGUF without a chat template, or a corrected one): the
    arguments and a note. ``--jinja --chat-template-file PATH`` (``--jinja`` first, so any
    template text is accepted, and only when the help lists it) when the engine's help lists
    ``--chat-template-file``; nothing, noted, when it does not or when EXTRA_ARGS already
    names a template (``--chat-template``/``--chat-template-file``: EXTRA_ARGS wins)."""
    path = cfg.chat_template_file.strip()
    if not path:
        return [], None
    clash = sorted(arg_names(tokens) & set(_TEMPLATE_FLAGS))
    if clash:
        return [], f"CHAT_TEMPLATE_FILE not passed: {clash[0]} in EXTRA_ARGS wins"
    if not help_.has("--chat-template-file"):
        return (
            [],
            "CHAT_TEMPLATE_FILE not passed: the engine's --help lists no --chat-template-file",
        )
    jinja = ["--jinja"] if help_.has("--jinja") else []
    return [*jinja, "--chat-template-file", path], f"chat template from {path}"


# ------------------------------------------------------------------------------ the plan
def plan_launch(cfg: LocalConfig, facts: Facts) -> LaunchPlan:
    """Build the engine's command line and notes from a local preset and the facts.

    Arguments, in order: ``-m``, ``-c``, ``-np``, ``--no-kv-unified`` (SIDE_SLOT), ``-ngl``,
    ``--metrics``, ``--host``, ``--port``, ``--api-key``, ``-t``, ``--ubatch-size`` (UBATCH,
    only when the engine's help lists it; else a note says it was left out), ``--slot-save-path``,
    ``--cache-ram``, the draft options, ``--jinja --chat-template-file`` (CHAT_TEMPLATE_FILE,
    :func:`chat_template_args`), ``--mmproj`` (MMPROJ, only when the engine's help lists it),
    ``--cache-reuse`` (COMPACT_TAIL_REUSE, only when the help
    lists it: :func:`~loki_supervisor.cache_reuse.cache_reuse_args`), then EXTRA_ARGS
    (last, so they win where llama.cpp keeps the last value).

    SIDE_SLOT accepted: ``-c 2×CTX -np 2 --no-kv-unified`` (two slots of CTX each). Refused
    or off: ``-c CTX -np PARALLEL`` (1 when unset), the refusal's reason in ``notes``.
    ``--slot-save-path`` only when the engine listens on loopback or has an API key, and the
    engine knows the option.

    Raises:
        ValueError: EXTRA_ARGS has unbalanced quotes or CACHE_RAM is malformed.
    """
    tokens = split_args(cfg.extra_args)
    notes: list[str] = []
    place = placement(cfg, facts, tokens)
    if place.imposed:
        notes.append(
            f"NGL imposed ({place.ngl_arg}): llama.cpp's automatic layer placement is bypassed"
        )
    refusal: str | None = None
    side_bytes: int | None = None
    side = False
    draft = draft_verdict(
        cfg.draft,
        facts.help,
        facts.gguf,
        facts.draft_gguf,
        facts.draft_vocab,
        arg_names(tokens),
    )
    ctk, ctv = cache_types(tokens, facts.env)
    if cfg.side_slot:
        two = 0
        if draft.on and facts.draft_gguf is not None:
            two = draft_bytes(facts.draft_gguf, cfg.ctx, 2, ctk, ctv)
        refusal, note, side_bytes = side_slot_verdict(cfg, facts, tokens, place, two)
        if refusal is None:
            side = True
            notes.append(note or "SIDE_SLOT on")
        else:
            notes.append(f"SIDE_SLOT refused, one slot kept: {refusal}")
    slots = 2 if side else (cfg.parallel or 1)
    draft = _draft_memory(draft, cfg, facts, place, slots, (ctk, ctv))
    if draft.refusal is not None:
        notes.append(f"draft model refused: {draft.refusal}")
    notes += draft.notes
    args: list[str] = ["-m", str(cfg.model), "-c", str(cfg.ctx * 2 if side else cfg.ctx)]
    args += ["-np", str(slots)]
    if side:
        args.append("--no-kv-unified")
    args += ["-ngl", place.ngl_arg, "--metrics", "--host", cfg.host, "--port", str(cfg.port)]
    if cfg.api_key:
        args += ["--api-key", cfg.api_key]
    if cfg.threads:
        args += ["-t", str(cfg.threads)]
    if cfg.ubatch is not None:
        if facts.help.has("--ubatch-size", "-ub"):
            args += ["--ubatch-size", str(cfg.ubatch)]
        else:
            notes.append(f"UBATCH {cfg.ubatch} left out: the engine's help lacks --ubatch-size")
    slot_path: Path | None = None
    if cfg.slot_dir is not None and facts.help.has("--slot-save-path"):
        if is_loopback(cfg.host) or cfg.api_key:
            slot_path = cfg.slot_dir
            args += ["--slot-save-path", str(slot_path)]
        else:
            notes.append("no --slot-save-path: the engine listens beyond loopback without a key")
    cram = cache_ram_decision(cfg, facts, tokens, place)
    if cram.value_mib is not None:
        args += ["--cache-ram", str(cram.value_mib)]
        notes.append(f"CACHE_RAM {cram.value_mib} MiB ({cram.reason})")
    args += draft.args
    template_args, template_note = chat_template_args(cfg, facts.help, tokens)
    args += template_args
    if template_note:
        notes.append(template_note)
    if cfg.mmproj:
        if facts.help.has("--mmproj"):
            args += ["--mmproj", cfg.mmproj]
            notes.append("MMPROJ: vision projector given (--mmproj)")
        else:
            notes.append("MMPROJ ignored: this llama-server does not list --mmproj")
    reuse_args, reuse_note = cache_reuse_args(
        cfg.tail_reuse, cfg.cache_reuse, facts.help, arg_names(tokens)
    )
    args += reuse_args
    if reuse_note:
        notes.append(reuse_note)
    args += tokens
    names = arg_names(tokens)
    unified = bool(names & {"-kvu", "--kv-unified"}) or truthy(
        facts.env.get("LLAMA_ARG_KV_UNIFIED")
    )
    np_extra = arg_value(tokens, "-np", "--parallel")
    shared = (unified and not side) or (np_extra is not None and np_extra.strip() in ("-1", "0"))
    return LaunchPlan(
        args=args,
        notes=notes,
        slots=slots,
        slot_ctx=cfg.ctx,
        side_slot=side,
        side_slot_refusal=refusal,
        placement=place.kind,
        cache_ram=cram,
        slot_save_path=slot_path,
        shared_window=shared,
        side_slot_bytes=side_bytes,
        draft=draft,
    )


def _draft_memory(
    draft: DraftVerdict,
    cfg: LocalConfig,
    facts: Facts,
    place: Placement,
    slots: int,
    cache: tuple[str, str],
) -> DraftVerdict:
    """The draft's memory check: model + its KV for every slot + the draft (file and KV
    for every slot) within 90% of VRAM (all-GPU model) or available RAM (CPU-only engine);
    a split or unknown placement, or unknown memory, is not refused (noted)."""
    if not draft.on or facts.draft_gguf is None or facts.gguf is None:
        return draft
    size = draft_bytes(facts.draft_gguf, cfg.ctx, slots, *cache)
    per_slot = facts.gguf.kv_bytes(cfg.ctx, *cache) + facts.gguf.recurrent_state_bytes()
    need = facts.gguf.file_size + slots * per_slot
    if place.kind == "gpu":
        room, what = facts.gpu.total, "VRAM"
    elif place.kind == "cpu":
        room, what = facts.host.available, "available RAM"
    else:
        room, what = None, f"memory ({place.why})"
    refusal, figures = memory_refusal(need, size, room, what)
    if refusal is not None:
        return DraftVerdict(refusal=refusal)
    note = f"draft model {Path(cfg.draft.model).name}: {figures}"
    return DraftVerdict(draft.args, None, (*draft.notes, note), size)
