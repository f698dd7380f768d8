"""Facts readers: GGUF header (checked against gguf.GGUFReader), NVML absent → unknown,
host RAM with a cgroup limit, the real engine's --help."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from loki_shared import servers
from loki_supervisor import facts


def test_gguf_facts_of_the_bundled_model_match_gguf_reader():
    from gguf import GGUFReader

    path = servers.find_bundled_model()
    got = facts.read_gguf(path)
    reader = GGUFReader(str(path))

    def field(key):
        return reader.fields[key].contents()

    assert got.architecture == field("general.architecture") == "llama"
    assert got.block_count == field("llama.block_count")
    assert got.embedding_length == field("llama.embedding_length")
    assert got.head_count == field("llama.attention.head_count")
    assert set(got.head_count_kv) == {field("llama.attention.head_count_kv")}
    assert got.context_length == field("llama.context_length")
    assert got.file_size == path.stat().st_size
    # 30 layers × 3 KV heads × (64 + 64) values × 2 bytes (f16).
    assert got.kv_bytes_per_token() == 30 * 3 * 128 * 2
    assert got.recurrent_state_bytes() == 0 and not got.hybrid


def test_not_a_gguf_is_unknown(tmp_path: Path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(ValueError):
        facts.read_gguf(bad)
    assert facts.try_read_gguf(bad) is None
    assert facts.try_read_gguf(tmp_path / "missing.gguf") is None
    # Random bytes after the magic: lengths past the end of the file are refused, not read.
    import os

    for seed in range(20):
        bad.write_bytes(b"GGUF" + os.urandom(512))
        assert facts.try_read_gguf(bad) is None


def test_nvml_absent_or_failing_is_unknown(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails: library absent
    assert facts.read_gpus() == facts.GpuFacts(known=False)
    broken = types.ModuleType("pynvml")

    def fail():
        raise RuntimeError("NVML Shared Library Not Found")

    broken.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    got = facts.read_gpus()
    assert not got.known and got.total is None and got.free is None


def test_nvml_present_reports_total_and_free(monkeypatch):
    fake = types.ModuleType("pynvml")
    mem = types.SimpleNamespace(total=24 << 30, free=20 << 30)
    fake.nvmlInit = lambda: None
    fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: 2
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetMemoryInfo = lambda h: mem
    fake.nvmlDeviceGetName = lambda h: b"NVIDIA Fake"
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    got = facts.read_gpus()
    assert got.known and len(got.gpus) == 2
    assert got.total == 48 << 30 and got.free == 40 << 30


def test_host_memory_is_capped_by_the_cgroup(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       33554432 kB\nMemFree: 1 kB\nMemAvailable:   16777216 kB\n")
    cg = tmp_path / "cg"
    cg.mkdir()
    assert facts.read_host_memory(meminfo, cg) == facts.HostMemory(32 << 30, 16 << 30)
    (cg / "memory.max").write_text(str(8 << 30))
    (cg / "memory.current").write_text(str(6 << 30))
    assert facts.read_host_memory(meminfo, cg) == facts.HostMemory(8 << 30, 2 << 30)
    (cg / "memory.max").write_text("max\n")
    assert facts.read_host_memory(meminfo, cg).total == 32 << 30
    assert facts.read_host_memory(tmp_path / "none", tmp_path / "none") == facts.HostMemory(
        None, None
    )


@pytest.mark.engine
def test_real_engine_help_lists_what_the_rules_need():
    help_ = facts.read_engine_help(servers.find_llama_server())
    for flag in (
        "-c",
        "-np",
        "-ngl",
        "--metrics",
        "--no-kv-unified",
        "--cache-ram",
        "--slot-save-path",
        "--kv-unified-per-slot",
        "--cache-idle-slots",
        "--ubatch-size",  # UBATCH
    ):
        assert help_.has(flag), flag
    assert help_.ngl_auto
    assert help_.env_of("-c") == ["LLAMA_ARG_CTX_SIZE"]
    assert help_.env_of("-np") == ["LLAMA_ARG_N_PARALLEL"]
    assert "LLAMA_ARG_KV_UNIFIED" in help_.env_of("--no-kv-unified")
    # both spellings of a "-c,    --ctx-size" line (short option padded with spaces)
    assert help_.has("--ctx-size") and help_.has("--parallel")
    # the draft options under the pinned build's names; the old ones are listed as removed
    from loki_supervisor.draft import MAX_FLAGS, MIN_FLAGS, MODEL_FLAGS, NGL_FLAGS, spelling

    assert spelling(help_, MODEL_FLAGS) == "--spec-draft-model"
    assert spelling(help_, MAX_FLAGS) == "--spec-draft-n-max"
    assert spelling(help_, MIN_FLAGS) == "--spec-draft-n-min"
    assert spelling(help_, NGL_FLAGS) == "--spec-draft-ngl"
    assert {"--draft-max", "--draft-min"} <= help_.removed
    assert "draft-simple" in help_.option_text("--spec-type")
    devices = facts.read_engine_devices(servers.find_llama_server())
    assert devices is not None
