"""Speculative decoding with a draft model (pure rules): which spellings are passed, the
refusals (vocabulary, GGUF, EXTRA_ARGS, memory), and how the draft counts in SIDE_SLOT's
memory check. Facts are injected; the vocabulary rule also runs on the bundled GGUF."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from loki_shared import servers
from loki_supervisor.draft import DraftRequest, draft_verdict, spelling
from loki_supervisor.facts import (
    MIB,
    GgufFacts,
    Gpu,
    GpuFacts,
    HostMemory,
    parse_help,
    read_vocab,
    try_vocab_difference,
    vocab_difference,
)
from loki_supervisor.plan import Facts, LocalConfig, plan_launch

GIB = 1024 * MIB

#: The draft options as llama.cpp b11434's --help lists them (new names, old ones removed).
NEW_HELP = parse_help("""\
-c,    --ctx-size N                     size of the prompt context (env: LLAMA_ARG_CTX_SIZE)
-np,   --parallel N                     number of parallel sequences to decode (default: -1)
-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM, either an exact
                                        number, 'auto', or 'all' (default: auto)
-kvu,  --kv-unified, -no-kvu, --no-kv-unified
                                        use single unified KV buffer
--slot-save-path PATH                   path to save slot kv cache (default: disabled)
----- speculative params -----
--spec-draft-n-max N                    number of tokens to draft for speculative decoding (default: 3)
                                        (env: LLAMA_ARG_SPEC_DRAFT_N_MAX)
--spec-draft-n-min N                    minimum number of draft tokens to use for speculative decoding
                                        (default: 0)
--spec-draft-ngl, -ngld, --gpu-layers-draft, --n-gpu-layers-draft N
                                        max. number of draft model layers to store in VRAM, either an exact
                                        number, 'auto', or 'all' (default: auto)
--spec-draft-model, -md, --model-draft FNAME
                                        draft model for speculative decoding (default: unused)
--spec-type none,draft-simple,draft-eagle3,ngram-simple,ngram-mod
                                        comma-separated list of types of speculative decoding to use (default:
                                        none)
--draft, --draft-n, --draft-max N       the argument has been removed. use --spec-draft-n-max or
                                        --spec-ngram-mod-n-max
                                        (env: LLAMA_ARG_DRAFT_MAX)
--draft-min, --draft-n-min N            the argument has been removed. use --spec-draft-n-min or
                                        --spec-ngram-mod-n-min
----- example-specific params -----
--metrics                               enable prometheus compatible metrics endpoint
""")
#: An older engine: the first names, no --spec-type.
OLD_HELP = parse_help("""\
-ngl,  --gpu-layers N                   max. number of layers to store in VRAM
-md,   --model-draft FNAME              draft model for speculative decoding (default: unused)
--draft-max, --draft, --draft-n N       number of tokens to draft (default: 16)
--draft-min, --draft-n-min N            minimum number of draft tokens (default: 0)
-ngld, --gpu-layers-draft, --n-gpu-layers-draft N
                                        number of layers to store in VRAM for the draft model
""")
NO_DRAFT_HELP = parse_help("-ngl,  --gpu-layers N   layers\n--metrics   metrics\n")

MAIN = GgufFacts(
    architecture="llama",
    file_size=4 * GIB,
    block_count=32,
    embedding_length=4096,
    head_count=32,
    head_count_kv=(8,) * 32,
)  # 128 KiB of KV per token
SMALL = GgufFacts(
    architecture="llama",
    file_size=512 * MIB,
    block_count=16,
    embedding_length=1024,
    head_count=16,
    head_count_kv=(4,) * 16,
)  # 16 KiB of KV per token
REQ = DraftRequest(model="/models/draft.gguf", max=8, min=2, ngl="all")


def test_help_marks_removed_spellings():
    assert NEW_HELP.has("--draft-max") and "--draft-max" in NEW_HELP.removed
    assert "--spec-draft-n-max" not in NEW_HELP.removed
    assert spelling(NEW_HELP, ("--spec-draft-n-max", "--draft-max")) == "--spec-draft-n-max"
    assert spelling(NEW_HELP, ("--draft-max",)) is None
    assert "draft-simple" in NEW_HELP.option_text("--spec-type")
    assert "--metrics" in NEW_HELP.flags and NEW_HELP.option_text("--metrics")


@pytest.mark.parametrize(
    "help_, expected",
    [
        (
            NEW_HELP,
            [
                "--spec-draft-model",
                "/models/draft.gguf",
                "--spec-draft-n-max",
                "8",
                "--spec-draft-n-min",
                "2",
                "--spec-draft-ngl",
                "all",
                "--spec-type",
                "draft-simple",
            ],
        ),
        (
            OLD_HELP,
            [
                "--model-draft",
                "/models/draft.gguf",
                "--draft-max",
                "8",
                "--draft-min",
                "2",
                "--gpu-layers-draft",
                "all",
            ],
        ),
    ],
)
def test_draft_arguments_use_the_spellings_the_engine_lists(help_, expected):
    v = draft_verdict(REQ, help_, MAIN, SMALL, None, set())
    assert v.refusal is None and list(v.args) == expected


def test_options_the_engine_lacks_are_left_out_with_a_note():
    help_ = parse_help("-md,   --model-draft FNAME   draft model\n")
    v = draft_verdict(REQ, help_, MAIN, SMALL, None, set())
    assert list(v.args) == ["--model-draft", "/models/draft.gguf"]
    assert any("DRAFT_MAX not passed" in n for n in v.notes)
    assert any("DRAFT_NGL not passed" in n for n in v.notes)


def test_unset_fields_are_not_passed():
    v = draft_verdict(DraftRequest(model="/d.gguf"), NEW_HELP, MAIN, SMALL, None, set())
    assert list(v.args) == ["--spec-draft-model", "/d.gguf", "--spec-type", "draft-simple"]
    assert draft_verdict(DraftRequest(), NEW_HELP, MAIN, SMALL, None, set()) == type(v)()


@pytest.mark.parametrize(
    "why, kw, reason",
    [
        ("engine without draft", dict(help_=NO_DRAFT_HELP), "lists no draft model option"),
        ("vocab", dict(vocab="token 7 is 'a' vs 'b'"), "vocabularies differ: token 7"),
        ("draft unreadable", dict(draft=None), "draft model's GGUF header is unreadable"),
        ("model unreadable", dict(main=None), "model's GGUF header is unreadable"),
        ("extra args", dict(names={"-md"}), "-md in EXTRA_ARGS"),
        ("min > max", dict(req=replace(REQ, min=9)), "DRAFT_MIN 9 > DRAFT_MAX 8"),
    ],
)
def test_refusals(why, kw, reason):
    v = draft_verdict(
        kw.get("req", REQ),
        kw.get("help_", NEW_HELP),
        kw.get("main", MAIN),
        kw.get("draft", SMALL),
        kw.get("vocab"),
        kw.get("names", set()),
    )
    assert not v.on and v.refusal is not None and reason in v.refusal, why


def _vocab(tokens, **kw):
    base = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.tokens": tokens,
    }
    base.update(kw)
    return base


def test_vocab_difference_follows_llama_cpp_rule():
    toks = [f"t{i}" for i in range(1000)]
    assert vocab_difference(_vocab(toks), _vocab(list(toks))) is None
    # sizes within 128 tokens: the common part decides (padded vocabularies)
    assert vocab_difference(_vocab(toks), _vocab(toks + ["x"] * 128)) is None
    assert "more than 128 apart" in (vocab_difference(_vocab(toks), _vocab(toks + ["x"] * 129)))
    # the first five ids (special tokens) are not compared, the rest are
    assert vocab_difference(_vocab(toks), _vocab(["s"] * 5 + toks[5:])) is None
    other = list(toks)
    other[500] = "zz"
    assert vocab_difference(_vocab(toks), _vocab(other)) == "token 500 is 't500' vs 'zz'"
    assert "tokenizer type" in vocab_difference(
        _vocab(toks), _vocab(toks, **{"tokenizer.ggml.model": "llama"})
    )
    assert "eos token id" in vocab_difference(
        _vocab(toks), _vocab(toks, **{"tokenizer.ggml.eos_token_id": 0})
    )
    assert "no tokenizer.ggml.tokens" in vocab_difference(_vocab(toks), _vocab(None))


def test_the_bundled_model_is_its_own_compatible_draft(tmp_path: Path):
    model = servers.find_bundled_model()
    vocab = read_vocab(model)
    assert len(vocab["tokenizer.ggml.tokens"]) > 1000
    assert try_vocab_difference(model, model) is None
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    assert "tokenizer unreadable" in try_vocab_difference(model, bad)


# ------------------------------------------------------------------ in the launch plan
GPU24 = GpuFacts(known=True, gpus=(Gpu("RTX", 24 * GIB, 23 * GIB),))
HOST = HostMemory(total=64 * GIB, available=48 * GIB)


def _plan(cfg_kw=None, **facts_kw):
    cfg = LocalConfig(
        **{"model": Path("/models/m.gguf"), "ctx": 8192, "draft": REQ, **(cfg_kw or {})}
    )
    base = dict(
        gguf=MAIN,
        gpu=GPU24,
        host=HOST,
        help=NEW_HELP,
        env={},
        engine_devices=["CUDA0: x"],
        draft_gguf=SMALL,
        draft_vocab=None,
    )
    base.update(facts_kw)
    return plan_launch(cfg, Facts(**base))


def test_plan_passes_the_draft_before_extra_args_and_notes_its_memory():
    plan = _plan(dict(extra_args="--temp 0"))
    args = plan.args
    assert args[-2:] == ["--temp", "0"]
    i = args.index("--spec-draft-model")
    assert args[i + 1] == "/models/draft.gguf" and i < args.index("--temp")
    # draft: 512 MiB file + 8192 × 16 KiB KV = 640 MiB, counted in VRAM
    assert plan.draft.bytes == 640 * MIB
    assert any("draft model draft.gguf" in n and "MiB VRAM" in n for n in plan.notes)


def test_plan_refuses_a_draft_that_does_not_fit():
    big = replace(SMALL, file_size=18 * GIB)
    plan = _plan(draft_gguf=big)
    assert not plan.draft.on and "--spec-draft-model" not in plan.args
    assert "above 90%" in plan.draft.refusal
    assert any(n.startswith("draft model refused:") for n in plan.notes)


def test_plan_refuses_a_draft_of_another_vocabulary():
    plan = _plan(draft_vocab="token 9 is 'a' vs 'b'")
    assert "--spec-draft-model" not in plan.args
    assert plan.draft.refusal == "vocabularies differ: token 9 is 'a' vs 'b'"


def test_the_draft_counts_in_side_slots_memory_check():
    # model 4 GiB + 2 × 1 GiB KV = 6 GiB: fits 90% of 8 GiB alone; with the draft
    # (1.5 GiB file + 2 × 128 MiB KV) it does not
    gpu8 = GpuFacts(known=True, gpus=(Gpu("small", 8 * GIB, 8 * GIB),))
    no_draft = _plan(dict(side_slot=True, draft=DraftRequest()), gpu=gpu8)
    assert no_draft.side_slot
    with_draft = _plan(
        dict(side_slot=True), gpu=gpu8, draft_gguf=replace(SMALL, file_size=1536 * MIB)
    )
    assert not with_draft.side_slot and "+ draft" in with_draft.side_slot_refusal


def test_a_cpu_engine_counts_the_draft_in_available_ram():
    tight = HostMemory(total=8 * GIB, available=int(5.5 * GIB))
    plan = _plan(gpu=GpuFacts(known=True), engine_devices=[], host=tight)
    assert plan.placement == "cpu" and not plan.draft.on
    assert "available RAM" in plan.draft.refusal
    assert _plan(gpu=GpuFacts(known=True), engine_devices=[]).draft.on
