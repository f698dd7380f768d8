"""COMPACT_TAIL_REUSE on the engine's side: llama-server's ``--cache-reuse N``.

With the key on, the chat service sends a compacted conversation tail first (the verbatim
tail right after the system prompt, the summary after it); ``--cache-reuse N`` lets
llama-server shift cached chunks of at least ``N`` tokens that match the new prompt instead
of computing them again, so the tail that moved up is reused. Passed only when the engine's
``--help`` lists the option and EXTRA_ARGS does not already set it (EXTRA_ARGS wins); the
launch notes say what was done (shown in ``loki.engine.info``).
"""

from __future__ import annotations

from .facts import EngineHelp

#: Default chunk size (tokens) of ``--cache-reuse`` when ``CACHE_REUSE`` is unset.
DEFAULT_CACHE_REUSE = 256
#: The option's spelling in llama-server's help.
FLAG = "--cache-reuse"


def chunk_tokens(value: str | None) -> int:
    """``CACHE_REUSE`` as tokens: a positive integer, else :data:`DEFAULT_CACHE_REUSE`
    (empty, malformed or not positive)."""
    try:
        n = int(str(value or "").strip())
    except ValueError:
        return DEFAULT_CACHE_REUSE
    return n if n > 0 else DEFAULT_CACHE_REUSE


def cache_reuse_args(
    enabled: bool, chunk: int, help_: EngineHelp, extra_names: set[str]
) -> tuple[list[str], str | None]:
    """The arguments and the launch note of COMPACT_TAIL_REUSE.

    Args:
        enabled: the key (``COMPACT_TAIL_REUSE`` of the preset's features).
        chunk: ``N`` of ``--cache-reuse`` (tokens, :func:`chunk_tokens`).
        help_: the engine's ``--help`` facts.
        extra_names: option names present in EXTRA_ARGS.

    Returns:
        ``(["--cache-reuse", "N"], note)`` when passed; ``([], note)`` when the key is on but
        the option is not passed (why); ``([], None)`` when the key is off.
    """
    if not enabled:
        return [], None
    if FLAG in extra_names:
        return [], f"COMPACT_TAIL_REUSE: {FLAG} in EXTRA_ARGS wins"
    if not help_.has(FLAG):
        return [], f"COMPACT_TAIL_REUSE: {FLAG} not passed (the engine's --help lists no {FLAG})"
    return [FLAG, str(chunk)], f"COMPACT_TAIL_REUSE: {FLAG} {chunk} (the moved tail is reused)"
