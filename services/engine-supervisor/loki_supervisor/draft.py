"""Speculative decoding with a draft model (pure rules): the preset's ``draft_model``,
``draft_max``, ``draft_min``, ``draft_ngl`` → llama-server arguments, or a refusal with its
reason. Facts (both GGUF headers, the engine's ``--help``) are read by
:mod:`loki_supervisor.facts`. Table tests: ``tests/engine/test_draft.py``.

Rules:

- every option is passed under the first spelling the engine's ``--help`` lists and does not
  mark as removed (llama.cpp renamed ``-md``/``--draft-max``/``--draft-min``/``-ngld`` to
  ``--spec-draft-*``, keeping the old names in the help as "the argument has been removed");
  an engine that lists no draft model option refuses the draft; DRAFT_MAX, DRAFT_MIN or the
  draft's GPU layers without a listed option are left out, with a note;
- ``--spec-type draft-simple`` is added when the engine lists ``--spec-type`` with that
  value (its default is ``none``: a draft model alone would not draft);
- the draft is refused when its vocabulary differs from the model's
  (:func:`loki_supervisor.facts.vocab_difference`), when either GGUF header is unreadable,
  or when model + draft + their KV caches for every slot exceed 90% of the memory they go to
  (VRAM for an all-GPU model, available RAM for a CPU-only engine);
- a draft option in EXTRA_ARGS (``-md``, ``--spec-draft-model``, ...) wins: Loki passes no
  draft option of its own then.
"""

from __future__ import annotations

from dataclasses import dataclass

from .facts import EngineHelp, GgufFacts

#: Spellings of each option, newest first (llama.cpp ``common/arg.cpp``).
MODEL_FLAGS = ("--spec-draft-model", "--model-draft", "-md")
MAX_FLAGS = ("--spec-draft-n-max", "--draft-max", "--draft-n", "--draft")
MIN_FLAGS = ("--spec-draft-n-min", "--draft-min", "--draft-n-min")
NGL_FLAGS = ("--spec-draft-ngl", "--gpu-layers-draft", "--n-gpu-layers-draft", "-ngld")
SPEC_TYPE_FLAG = "--spec-type"
SPEC_TYPE_DRAFT = "draft-simple"
#: Model + draft + KV must fit in this share of the memory they go to.
DRAFT_MEMORY_SHARE = 0.90


def spelling(help_: EngineHelp, candidates: tuple[str, ...]) -> str | None:
    """The first of ``candidates`` the help lists and does not mark as removed."""
    for flag in candidates:
        if help_.has(flag) and flag not in help_.removed:
            return flag
    return None


@dataclass(frozen=True)
class DraftRequest:
    """The preset's draft fields: ``model`` (GGUF path, "" for none), ``max``/``min``
    (tokens per step, None: the engine's default), ``ngl`` (GPU layers, None: the
    engine's default)."""

    model: str = ""
    max: int | None = None
    min: int | None = None
    ngl: str | None = None


@dataclass(frozen=True)
class DraftVerdict:
    """The decision. ``args``: what to pass (empty when refused or not asked);
    ``refusal``: why the draft is not passed (None when passed or not asked); ``notes``: for
    a person; ``bytes``: the draft's memory (file + KV of every slot) when passed."""

    args: tuple[str, ...] = ()
    refusal: str | None = None
    notes: tuple[str, ...] = ()
    bytes: int | None = None

    @property
    def on(self) -> bool:
        return bool(self.args)


def draft_bytes(draft: GgufFacts, slot_ctx: int, slots: int, ctk: str, ctv: str) -> int:
    """The draft's memory: its file plus its KV cache (and recurrent state) for ``slots``
    slots of ``slot_ctx`` tokens (bytes)."""
    per_slot = draft.kv_bytes(slot_ctx, ctk, ctv) + draft.recurrent_state_bytes()
    return draft.file_size + slots * per_slot


def draft_verdict(
    req: DraftRequest,
    help_: EngineHelp,
    main: GgufFacts | None,
    draft: GgufFacts | None,
    vocab_difference: str | None,
    extra_arg_names: set[str],
) -> DraftVerdict:
    """The draft's arguments or its refusal, memory aside (see :func:`memory_refusal`).

    ``vocab_difference``: :func:`loki_supervisor.facts.vocab_difference`'s answer (None:
    same vocabulary). ``extra_arg_names``: option names in EXTRA_ARGS.
    """
    if not req.model:
        return DraftVerdict()
    every = set(MODEL_FLAGS + MAX_FLAGS + MIN_FLAGS + NGL_FLAGS)
    if extra_arg_names & every:
        clash = " ".join(sorted(extra_arg_names & every))
        return DraftVerdict(refusal=f"{clash} in EXTRA_ARGS: the draft options there win")
    model_flag = spelling(help_, MODEL_FLAGS)
    if model_flag is None:
        return DraftVerdict(refusal="the engine's --help lists no draft model option")
    if main is None:
        return DraftVerdict(refusal="the model's GGUF header is unreadable")
    if draft is None:
        return DraftVerdict(refusal=f"the draft model's GGUF header is unreadable ({req.model})")
    if vocab_difference is not None:
        return DraftVerdict(refusal=f"vocabularies differ: {vocab_difference}")
    if req.min is not None and req.max is not None and req.min > req.max:
        return DraftVerdict(refusal=f"DRAFT_MIN {req.min} > DRAFT_MAX {req.max}")
    args: list[str] = [model_flag, req.model]
    notes: list[str] = []
    for value, flags, name in (
        (req.max, MAX_FLAGS, "DRAFT_MAX"),
        (req.min, MIN_FLAGS, "DRAFT_MIN"),
        (req.ngl, NGL_FLAGS, "DRAFT_NGL"),
    ):
        if value is None or str(value).strip() == "":
            continue
        flag = spelling(help_, flags)
        if flag is None:
            notes.append(f"{name} not passed: the engine's --help lists no option for it")
            continue
        args += [flag, str(value).strip()]
    if help_.has(SPEC_TYPE_FLAG) and SPEC_TYPE_DRAFT in help_.option_text(SPEC_TYPE_FLAG):
        args += [SPEC_TYPE_FLAG, SPEC_TYPE_DRAFT]
    return DraftVerdict(args=tuple(args), notes=tuple(notes))


def memory_refusal(
    need_without_draft: int, draft_size: int, room: int | None, what: str
) -> tuple[str | None, str]:
    """Whether model + KV (``need_without_draft``) + the draft (``draft_size``) fit in 90% of
    ``room`` (bytes of ``what``: VRAM or available RAM). Returns ``(refusal, figures)``;
    ``room`` None: never refused (the figures say it is unknown)."""
    mib = 1024 * 1024
    total = need_without_draft + draft_size
    if room is None:
        return None, f"draft {-(-draft_size // mib)} MiB ({what} unknown)"
    figures = (
        f"model and KV {-(-need_without_draft // mib)} MiB + draft {-(-draft_size // mib)} MiB"
        f" = {-(-total // mib)} MiB of {room // mib} MiB {what}"
    )
    if total > DRAFT_MEMORY_SHARE * room:
        return f"{figures}: above 90%", figures
    return None, figures
