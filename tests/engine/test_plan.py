"""Table tests of the launch rules (pure): command line, NGL, SIDE_SLOT refusals, CACHE_RAM
arithmetic, --slot-save-path. GPU, GGUF, RAM and help facts are injected."""

from __future__ import annotations

from pathlib import Path

import pytest

from loki_shared.messages.engine import Preset
from loki_supervisor.errors import InvalidRequest
from loki_supervisor.facts import MIB, EngineHelp, GgufFacts, Gpu, GpuFacts, HostMemory, parse_help
from loki_supervisor.plan import (
    ENGINE_DEFAULT_CACHE_RAM_MIB,
    Facts,
    LocalConfig,
    cache_ram_decision,
    placement,
    plan_launch,
)
from loki_supervisor.presets import validate

GIB = 1024 * MIB

HELP_TEXT = """\
----- common params -----

-h,    --help, --usage                  print usage and exit
-t,    --threads N                      number of CPU threads (env: LLAMA_ARG_THREADS)
-c,    --ctx-size N                     size of the prompt context (default: 4096, 0 = loaded
                                        from model)
                                        (env: LLAMA_ARG_CTX_SIZE)
-np,   --parallel N                     number of parallel sequences to decode (default: -1)
                                        (env: LLAMA_ARG_N_PARALLEL)
-kvu,  --kv-unified, -no-kvu, --no-kv-unified
                                        use single unified KV buffer shared across all
                                        sequences (env: LLAMA_ARG_KV_UNIFIED)
--cache-idle-slots, --no-cache-idle-slots
                                        save and clear idle slots (env: LLAMA_ARG_CACHE_IDLE_SLOTS)
-ngl,  --gpu-layers, --n-gpu-layers N   max. number of layers to store in VRAM, either an exact
                                        number, 'auto', or 'all' (default: auto)
                                        (env: LLAMA_ARG_N_GPU_LAYERS)
-cram, --cache-ram N                    set the maximum cache size in MiB (default: 8192, -1 -
                                        no limit, 0 - disable) (env: LLAMA_ARG_CACHE_RAM)
--ctx-checkpoints, --swa-checkpoints N  max number of context checkpoints to create per slot
                                        (default: 8) (env: LLAMA_ARG_CTX_CHECKPOINTS)
--slot-save-path PATH                   path to save slot kv cache (default: disabled)
--metrics                               enable prometheus compatible metrics endpoint
"""
HELP = parse_help(HELP_TEXT)
OLD_HELP = parse_help(
    "-c,    --ctx-size N   size (env: LLAMA_ARG_CTX_SIZE)\n"
    "-np,   --parallel N   slots (env: LLAMA_ARG_N_PARALLEL)\n"
    "-ngl,  --gpu-layers N max. number of layers to store in VRAM\n"
    "--metrics             metrics\n"
)

#: A 7B-like dense model: 32 layers × 8 KV heads × 128 × 2 (K, V) × 2 bytes = 128 KiB/token.
DENSE = GgufFacts(
    architecture="llama",
    file_size=4 * GIB,
    context_length=32768,
    block_count=32,
    embedding_length=4096,
    head_count=32,
    head_count_kv=(8,) * 32,
)
#: A hybrid (gated delta net + attention every 4th layer) model.
HYBRID = GgufFacts(
    architecture="qwen3next",
    file_size=8 * GIB,
    context_length=262144,
    block_count=48,
    embedding_length=2048,
    head_count=16,
    head_count_kv=(2,) * 48,
    key_length=256,
    value_length=256,
    full_attention_interval=4,
    ssm_conv_kernel=4,
    ssm_inner_size=4096,
    ssm_state_size=128,
    ssm_group_count=16,
    ssm_time_step_rank=32,
)
GPU24 = GpuFacts(known=True, gpus=(Gpu("NVIDIA Test 24G", 24 * GIB, 22 * GIB),))
GPU6 = GpuFacts(known=True, gpus=(Gpu("NVIDIA Test 6G", 6 * GIB, 5 * GIB),))
NO_NVML = GpuFacts(known=False)
HOST = HostMemory(total=64 * GIB, available=48 * GIB)
MODEL = Path("/models/m.gguf")


def cfg(**kw) -> LocalConfig:
    base = dict(model=MODEL, ctx=8192, host="127.0.0.1", port=8091, slot_dir=Path("/home/slots"))
    base.update(kw)
    return LocalConfig(**base)


def facts(**kw) -> Facts:
    base = dict(gguf=DENSE, gpu=GPU24, host=HOST, help=HELP, env={}, engine_devices=["CUDA0: x"])
    base.update(kw)
    return Facts(**base)


CPU_FACTS = dict(gpu=NO_NVML, engine_devices=[])


def test_kv_bytes_per_token_dense_and_hybrid():
    assert DENSE.kv_bytes_per_token() == 32 * 8 * (128 * 2 + 128 * 2)
    assert DENSE.kv_bytes(8192) == 1 * GIB
    # q8_0 keys and values: 34 bytes per 32 values.
    assert DENSE.kv_bytes_per_token("q8_0", "q8_0") == pytest.approx(32 * 8 * 256 * 34 / 32)
    assert HYBRID.attention_layers == 12 and HYBRID.recurrent_layers == 36
    assert HYBRID.kv_bytes_per_token() == 12 * 2 * (256 * 2 + 256 * 2)
    conv = 3 * (4096 + 2 * 16 * 128)
    ssm = 128 * 128 * 32
    assert HYBRID.recurrent_state_bytes() == 4 * (conv + ssm) * 36
    assert DENSE.recurrent_state_bytes() == 0


def test_command_line_one_slot_on_gpu():
    plan = plan_launch(cfg(), facts())
    assert plan.args == [
        "-m",
        str(MODEL),
        "-c",
        "8192",
        "-np",
        "1",
        "-ngl",
        "auto",
        "--metrics",
        "--host",
        "127.0.0.1",
        "--port",
        "8091",
        "--slot-save-path",
        "/home/slots",
    ]
    assert plan.slots == 1 and not plan.side_slot and plan.side_slot_refusal is None
    assert plan.placement == "gpu" and plan.notes == []


def test_side_slot_accepted_gives_two_unshared_slots_of_ctx():
    off = plan_launch(cfg(), facts())
    on = plan_launch(cfg(side_slot=True), facts())
    assert on.side_slot and on.slots == 2 and on.slot_ctx == 8192
    assert on.args[:7] == ["-m", str(MODEL), "-c", "16384", "-np", "2", "--no-kv-unified"]
    assert on.args[7:] == off.args[6:]
    assert any("second slot uses 1024 MiB" in n and "VRAM" in n for n in on.notes)
    assert on.side_slot_bytes == 1 * GIB and not on.shared_window


def test_side_slot_parallel_two_is_accepted():
    assert plan_launch(cfg(side_slot=True, parallel=2), facts()).side_slot


REFUSALS = [
    ("parallel 3", dict(parallel=3), {}, "PARALLEL=3"),
    ("parallel 1", dict(parallel=1), {}, "PARALLEL=1"),
    *[
        (
            f"extra {flag}",
            dict(
                extra_args=f"{flag} 4"
                if flag in ("-c", "--ctx-size", "-np", "--parallel")
                else flag
            ),
            {},
            flag,
        )
        for flag in (
            "-c",
            "--ctx-size",
            "-np",
            "--parallel",
            "-kvu",
            "--kv-unified",
            "--no-kv-unified",
            "--kv-unified-per-slot",
            "--cache-idle-slots",
        )
    ],
    ("extra --ctx-size=4096", dict(extra_args="--ctx-size=4096"), {}, "--ctx-size"),
    *[
        (f"env {name}", {}, dict(env={name: "1"}), name)
        for name in (
            "LLAMA_ARG_CTX_SIZE",
            "LLAMA_ARG_N_PARALLEL",
            "LLAMA_ARG_KV_UNIFIED",
            "LLAMA_ARG_KV_UNIFIED_PER_SLOT",
            "LLAMA_ARG_CACHE_IDLE_SLOTS",
        )
    ],
    ("engine without --no-kv-unified", {}, dict(help=OLD_HELP), "--no-kv-unified"),
    ("engine help unknown", {}, dict(help=EngineHelp()), "--no-kv-unified"),
    ("GGUF unknown", {}, dict(gguf=None), "GGUF"),
    ("VRAM unknown (NVML absent)", {}, dict(gpu=NO_NVML), "VRAM unknown"),
    ("GPU presence unknown", {}, dict(gpu=NO_NVML, engine_devices=None), "GPU unknown"),
    ("weights split by NGL", dict(ngl="20"), {}, "NGL 20 of 33"),
    ("weights on CPU by --cpu-moe", dict(extra_args="--cpu-moe"), {}, "--cpu-moe"),
    ("weights on CPU by -ot", dict(extra_args="-ot exps=CPU"), {}, "-ot"),
    ("NGL 0 beside a GPU", dict(ngl="0"), {}, "NGL 0"),
    ("above 90% of VRAM", {}, dict(gpu=GPU6), "above 90%"),
    (
        "CPU-only: RAM unknown",
        dict(ngl="0"),
        dict(host=HostMemory(None, None), **CPU_FACTS),
        "available RAM unknown",
    ),
    (
        "CPU-only: RAM too small",
        {},
        dict(host=HostMemory(8 * GIB, 6 * GIB), **CPU_FACTS),
        "above 90%",
    ),
]


@pytest.mark.parametrize("name,cfg_kw,facts_kw,reason", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_side_slot_refusal_keeps_the_line_without_the_key(name, cfg_kw, facts_kw, reason):
    f = facts(**facts_kw)
    without = plan_launch(cfg(**cfg_kw), f)
    refused = plan_launch(cfg(side_slot=True, **cfg_kw), f)
    assert not refused.side_slot
    assert refused.side_slot_refusal is not None and reason in refused.side_slot_refusal
    assert refused.args == without.args
    assert refused.slots == without.slots
    assert any(n.startswith("SIDE_SLOT refused") and reason in n for n in refused.notes)


def test_side_slot_cpu_only_checked_against_available_ram():
    plan = plan_launch(cfg(side_slot=True), facts(**CPU_FACTS))
    assert plan.side_slot and plan.placement == "cpu"
    assert "-ngl" in plan.args and plan.args[plan.args.index("-ngl") + 1] == "0"
    assert any("available RAM" in n for n in plan.notes)


NGL_CASES = [
    # (NGL, extra args, facts, expected -ngl, imposed warning, placement)
    (None, "", {}, "auto", False, "gpu"),
    ("auto", "", {}, "auto", False, "gpu"),
    ("all", "", {}, "auto", False, "gpu"),
    ("999", "", {}, "auto", False, "gpu"),
    ("999", "", dict(help=OLD_HELP), "999", False, "gpu"),
    (None, "", dict(help=OLD_HELP), "999", False, "gpu"),
    ("33", "", {}, "33", True, "gpu"),
    ("20", "", {}, "20", True, "split"),
    (None, "-ngl 12", {}, "12", True, "split"),
    (None, "", CPU_FACTS, "0", False, "cpu"),
    ("0", "", dict(gpu=NO_NVML, engine_devices=None), "0", True, "cpu"),
    (None, "", dict(gpu=GPU24, engine_devices=None), "auto", False, "gpu"),
    (None, "", dict(gpu=GpuFacts(known=True, gpus=()), engine_devices=None), "0", False, "cpu"),
]


@pytest.mark.parametrize("ngl,extra,facts_kw,expected,imposed,where", NGL_CASES)
def test_ngl_rules(ngl, extra, facts_kw, expected, imposed, where):
    plan = plan_launch(cfg(ngl=ngl, extra_args=extra), facts(**facts_kw))
    assert plan.args[plan.args.index("-ngl") + 1] == expected
    assert any("NGL imposed" in n for n in plan.notes) == imposed
    assert plan.placement == where


def _cram(cfg_kw=None, **facts_kw):
    c = cfg(**(cfg_kw or {}))
    f = facts(**facts_kw)
    from loki_supervisor.plan import split_args

    tokens = split_args(c.extra_args)
    return cache_ram_decision(c, f, tokens, placement(c, f, tokens))


def test_cache_ram_explicit_values_pass_as_is():
    for text, value in (("4096", 4096), ("-1", -1), ("0", 0), ("20000", 20000)):
        d = _cram(dict(cache_ram=text))
        assert d.value_mib == value
        plan = plan_launch(cfg(cache_ram=text), facts())
        assert plan.args[plan.args.index("--cache-ram") + 1] == str(value)


def test_cache_ram_silent_when_set_elsewhere_or_unknown_to_engine():
    assert _cram(dict(cache_ram="4096", extra_args="-cram 1000")).value_mib is None
    assert _cram(dict(cache_ram="4096", extra_args="-cram 1000")).effective_mib == 1000
    assert _cram(dict(cache_ram="4096"), env={"LLAMA_ARG_CACHE_RAM": "500"}).value_mib is None
    assert _cram(dict(cache_ram="4096"), help=OLD_HELP).value_mib is None
    plan = plan_launch(cfg(cache_ram="4096", extra_args="-cram 1000"), facts())
    assert plan.args.count("-cram") == 1 and "--cache-ram" not in plan.args


def test_cache_ram_malformed_is_refused():
    with pytest.raises(ValueError):
        _cram(dict(cache_ram="lots"))
    with pytest.raises(ValueError):
        _cram(dict(cache_ram="-2"))


CRAM_AUTO = [
    # name, cfg kw, facts kw, expected value passed (None: no flag), need MiB, cap MiB
    # need = 2.5 × 128 KiB × CTX: CTX 8192 → 2560 MiB (below the default: no flag).
    ("small ctx stays at default", dict(ctx=8192), {}, None, 2560, 19660),
    # CTX 65536 → 20480 MiB; cap = min(30% of 64 GiB, 50% of 48 GiB) = 19660 MiB.
    ("big ctx capped at 30% RAM", dict(ctx=65536), {}, 19660, 20480, 19660),
    ("big ctx raised to need", dict(ctx=32768), {}, 10240, 10240, 19660),
    (
        "capped at half the free RAM",
        dict(ctx=65536),
        dict(host=HostMemory(total=128 * GIB, available=30 * GIB)),
        15360,
        20480,
        15360,
    ),
    (
        "cgroup-limited RAM below default",
        dict(ctx=65536),
        dict(host=HostMemory(total=16 * GIB, available=12 * GIB)),
        None,
        20480,
        4915,
    ),
    ("CPU-only: engine default", dict(ctx=65536), CPU_FACTS, None, None, None),
    ("NVML unknown: engine default", dict(ctx=65536), dict(gpu=NO_NVML), None, None, None),
    ("weights split: engine default", dict(ctx=65536, ngl="10"), {}, None, None, None),
    ("KV on CPU: engine default", dict(ctx=65536, extra_args="-nkvo"), {}, None, None, None),
    ("GGUF unknown: engine default", dict(ctx=65536), dict(gguf=None), None, None, None),
    (
        "RAM unknown: engine default",
        dict(ctx=65536),
        dict(host=HostMemory(None, None)),
        None,
        20480,
        None,
    ),
]


@pytest.mark.parametrize(
    "name,cfg_kw,facts_kw,value,need,cap", CRAM_AUTO, ids=[c[0] for c in CRAM_AUTO]
)
def test_cache_ram_auto_arithmetic(name, cfg_kw, facts_kw, value, need, cap):
    d = _cram(dict(cache_ram="auto", **cfg_kw), **facts_kw)
    assert d.value_mib == value
    assert d.need_mib == need
    assert d.cap_mib == cap
    # Auto never goes below the engine default.
    assert d.effective_mib is None or d.effective_mib >= ENGINE_DEFAULT_CACHE_RAM_MIB


def test_cache_ram_auto_hybrid_counts_recurrent_state_and_checkpoints():
    d = _cram(
        dict(cache_ram="", ctx=131072),
        gguf=HYBRID,
        gpu=GpuFacts(known=True, gpus=(Gpu("NVIDIA 80G", 80 * GIB, 78 * GIB),)),
        host=HostMemory(total=256 * GIB, available=200 * GIB),
    )
    kv = HYBRID.kv_bytes(131072)
    rec = HYBRID.recurrent_state_bytes()
    expected = -(-(2.5 * kv + rec * (1 + 8)) // MIB)
    assert d.need_mib == int(expected)
    assert d.value_mib == int(expected)
    d3 = _cram(
        dict(cache_ram="", ctx=131072, extra_args="--ctx-checkpoints 3"),
        gguf=HYBRID,
        gpu=GpuFacts(known=True, gpus=(Gpu("NVIDIA 80G", 80 * GIB, 78 * GIB),)),
        host=HostMemory(total=256 * GIB, available=200 * GIB),
    )
    assert d3.need_mib < d.need_mib


SLOT_PATH = [
    ("loopback", dict(host="127.0.0.1"), {}, True),
    ("localhost", dict(host="localhost"), {}, True),
    ("ipv6 loopback", dict(host="::1"), {}, True),
    ("all interfaces without key", dict(host="0.0.0.0"), {}, False),
    ("all interfaces with key", dict(host="0.0.0.0", api_key="k"), {}, True),
    ("engine without the option", {}, dict(help=OLD_HELP), False),
]


@pytest.mark.parametrize("name,cfg_kw,facts_kw,present", SLOT_PATH, ids=[s[0] for s in SLOT_PATH])
def test_slot_save_path_only_on_loopback_or_with_a_key(name, cfg_kw, facts_kw, present):
    plan = plan_launch(cfg(**cfg_kw), facts(**facts_kw))
    assert ("--slot-save-path" in plan.args) == present
    assert (plan.slot_save_path is not None) == present


def test_api_key_is_masked_and_extra_args_come_last():
    plan = plan_launch(cfg(api_key="sekret", extra_args="-t 2 --temp 0.5"), facts())
    assert plan.args[-4:] == ["-t", "2", "--temp", "0.5"]
    assert "sekret" in plan.args and "sekret" not in plan.masked_args()


def test_unified_kv_in_extra_args_is_a_shared_window():
    assert plan_launch(cfg(extra_args="-kvu"), facts()).shared_window
    assert not plan_launch(cfg(), facts()).shared_window


def test_parse_help_reads_flags_env_and_ngl_auto():
    assert HELP.has("--no-kv-unified") and HELP.has("-cram") and HELP.ngl_auto
    assert HELP.env_of("-c") == ["LLAMA_ARG_CTX_SIZE"]
    assert HELP.env_of("--no-kv-unified") == ["LLAMA_ARG_KV_UNIFIED"]
    assert not OLD_HELP.ngl_auto and not OLD_HELP.has("--cache-ram")


TEMPLATE_HELP = parse_help(
    HELP_TEXT
    + "--jinja, --no-jinja                     whether to use jinja template engine for chat\n"
    + "--chat-template JINJA_TEMPLATE          set custom jinja chat template\n"
    + "--chat-template-file JINJA_TEMPLATE_FILE\n"
    + "                                        set custom jinja chat template file\n"
)


@pytest.mark.parametrize(
    "name,cfg_kw,help_,args,note",
    [
        ("unset", {}, TEMPLATE_HELP, [], None),
        (
            "passed",
            {"chat_template_file": "/t/gemma.jinja"},
            TEMPLATE_HELP,
            ["--jinja", "--chat-template-file", "/t/gemma.jinja"],
            "chat template from /t/gemma.jinja",
        ),
        (
            "engine does not know it",
            {"chat_template_file": "/t/gemma.jinja"},
            HELP,
            [],
            "CHAT_TEMPLATE_FILE not passed: the engine's --help lists no --chat-template-file",
        ),
        (
            "EXTRA_ARGS names a template",
            {"chat_template_file": "/t/gemma.jinja", "extra_args": "--chat-template chatml"},
            TEMPLATE_HELP,
            [],
            "CHAT_TEMPLATE_FILE not passed: --chat-template in EXTRA_ARGS wins",
        ),
    ],
)
def test_chat_template_file_only_when_the_engine_lists_the_flag(name, cfg_kw, help_, args, note):
    """Issue 16: a GGUF without a chat template (Gemma 3 270M on PyPI) gets one from a file;
    ``--jinja`` first (any template text accepted), before EXTRA_ARGS, which win."""
    plan = plan_launch(cfg(**cfg_kw), facts(help=help_))
    got = [a for a in plan.args if a in ("--jinja", "--chat-template-file") or a.endswith(".jinja")]
    assert got == args
    if args:
        i = plan.args.index("--jinja")
        assert plan.args[i : i + 3] == args
    assert (note in plan.notes) if note else not any("template" in n for n in plan.notes)


def test_ubatch_passed_only_when_the_engine_lists_it():
    """UBATCH becomes ``--ubatch-size`` where the help lists it; else it is left out with a
    note (an engine that does not know an option refuses to start)."""
    ub_help = parse_help(
        HELP_TEXT + "-ub,   --ubatch-size N                  physical maximum batch size\n"
    )
    plan = plan_launch(cfg(ubatch=256), facts(help=ub_help))
    i = plan.args.index("--ubatch-size")
    assert plan.args[i + 1] == "256"
    assert not any("UBATCH" in n for n in plan.notes)
    plan = plan_launch(cfg(ubatch=256), facts())  # HELP lacks it
    assert "--ubatch-size" not in plan.args and "-ub" not in plan.args
    assert "UBATCH 256 left out: the engine's help lacks --ubatch-size" in plan.notes
    # unset: no flag, no note (the command line stays as before)
    assert plan_launch(cfg(), facts(help=ub_help)).args == plan_launch(cfg(), facts()).args
    with pytest.raises(InvalidRequest, match="UBATCH must be at least 1"):
        validate(Preset(id="x", ubatch=0))
    validate(Preset(id="x", ubatch=64))


def test_mmproj_passed_only_when_the_engine_lists_it():
    with_mmproj = parse_help(HELP_TEXT + "-mm,   --mmproj FILE    path to a multimodal projector\n")
    plan = plan_launch(cfg(mmproj="/m/proj.gguf"), facts(help=with_mmproj))
    at = plan.args.index("--mmproj")
    assert plan.args[at + 1] == "/m/proj.gguf"
    assert "MMPROJ: vision projector given (--mmproj)" in plan.notes
    old = plan_launch(cfg(mmproj="/m/proj.gguf"), facts())
    assert "--mmproj" not in old.args
    assert "MMPROJ ignored: this llama-server does not list --mmproj" in old.notes
    assert "--mmproj" not in plan_launch(cfg(), facts(help=with_mmproj)).args
