"""COMPACT_TAIL_REUSE on the supervisor's side: ``--cache-reuse N`` in the launch plan only
when the key is on and the engine's ``--help`` lists it (EXTRA_ARGS win), said in the notes;
the env preset carries the key as features only when it is on."""

from __future__ import annotations

from pathlib import Path

import pytest

from loki_supervisor.cache_reuse import DEFAULT_CACHE_REUSE, chunk_tokens
from loki_supervisor.facts import parse_help
from loki_supervisor.plan import plan_launch
from loki_supervisor.presets import env_preset
from loki_supervisor.settings import Settings

from .test_plan import HELP, HELP_TEXT, cfg, facts

REUSE_HELP = parse_help(
    HELP_TEXT + "--cache-reuse N                         min chunk size to attempt reusing from "
    "the cache via KV shifting (default: 0)\n"
)


@pytest.mark.parametrize(
    "cfg_kw,help_,args,note",
    [
        ({}, REUSE_HELP, [], None),  # key off: nothing, no note
        (
            {"tail_reuse": True},
            REUSE_HELP,
            ["--cache-reuse", "256"],
            "COMPACT_TAIL_REUSE: --cache-reuse 256 (the moved tail is reused)",
        ),
        (
            {"tail_reuse": True, "cache_reuse": 64},
            REUSE_HELP,
            ["--cache-reuse", "64"],
            "COMPACT_TAIL_REUSE: --cache-reuse 64 (the moved tail is reused)",
        ),
        (
            {"tail_reuse": True},
            HELP,
            [],
            "COMPACT_TAIL_REUSE: --cache-reuse not passed (the engine's --help lists no "
            "--cache-reuse)",
        ),
        (
            {"tail_reuse": True, "extra_args": "--cache-reuse 32"},
            REUSE_HELP,
            ["--cache-reuse", "32"],  # EXTRA_ARGS' own, last
            "COMPACT_TAIL_REUSE: --cache-reuse in EXTRA_ARGS wins",
        ),
    ],
)
def test_cache_reuse_only_when_the_key_is_on_and_the_engine_lists_it(cfg_kw, help_, args, note):
    plan = plan_launch(cfg(**cfg_kw), facts(help=help_))
    got = [
        a
        for i, a in enumerate(plan.args)
        if a == "--cache-reuse" or plan.args[i - 1] == "--cache-reuse"
    ]
    assert got == args
    if note:
        assert note in plan.notes
    else:
        assert not any("COMPACT_TAIL_REUSE" in n for n in plan.notes)


def test_key_off_leaves_the_command_line_as_it_was():
    assert (
        plan_launch(cfg(), facts(help=REUSE_HELP)).args
        == plan_launch(cfg(tail_reuse=False, cache_reuse=64), facts(help=REUSE_HELP)).args
    )


def test_chunk_tokens_defaults():
    assert chunk_tokens("128") == 128
    assert chunk_tokens("") == chunk_tokens(None) == chunk_tokens("x") == DEFAULT_CACHE_REUSE
    assert chunk_tokens("0") == DEFAULT_CACHE_REUSE


def test_env_preset_features_only_with_the_key(tmp_path: Path):
    off = env_preset(Settings(home=tmp_path))
    assert "COMPACT_TAIL_REUSE" not in off.features and "CACHE_REUSE" not in off.features
    on = env_preset(Settings(home=tmp_path, compact_tail_reuse=True, cache_reuse=128))
    assert on.features["COMPACT_TAIL_REUSE"] == "on" and on.features["CACHE_REUSE"] == "128"
