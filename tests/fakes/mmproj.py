"""A tiny random-weight vision projector (``mmproj`` GGUF) that llama-server accepts beside a
text model: the multimodal path runs for real (image decoding, image tokens in the prompt,
``prompt_tokens``, the prompt cache), the answers mean nothing.

Shape (llama.cpp's LLaVA "mlp" projector, the plainest it loads): an image is resized to
``image_size`` pixels square, cut into ``patch_size`` patches (one image token each:
``(image_size / patch_size) ** 2``), each patch embedded by a convolution plus a position
embedding, then projected by two linear layers (GELU between) to the text model's embedding
width. The encoder has one block whose weights are present (the loader wants them) but unused:
the LLaVA graph stops before the last block.

The weights come from a seeded generator, so the same arguments write the same file.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def text_embedding_width(model: Path) -> int:
    """The text model's embedding width (``<arch>.embedding_length``) read from its GGUF."""
    reader = gguf.GGUFReader(str(model))
    arch_field = reader.fields["general.architecture"]
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
    field = reader.fields[f"{arch}.embedding_length"]
    return int(field.parts[field.data[0]][0])


def write_mmproj(
    path: Path,
    n_embd_text: int,
    *,
    image_size: int = 32,
    patch_size: int = 8,
    n_embd: int = 32,
    n_ff: int = 64,
    hidden: int = 64,
    seed: int = 7,
) -> int:
    """Write the projector to ``path``; return the image tokens one image costs."""
    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float = 0.02, dtype: type = np.float32) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(dtype)

    n_patches = (image_size // patch_size) ** 2
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.name", "loki-test-mmproj")
    w.add_uint32("general.file_type", 1)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch_size)
    w.add_uint32("clip.vision.embedding_length", n_embd)
    w.add_uint32("clip.vision.feed_forward_length", n_ff)
    w.add_uint32("clip.vision.block_count", 1)
    w.add_uint32("clip.vision.projection_dim", n_embd_text)
    w.add_uint32("clip.vision.attention.head_count", 2)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    # numpy shapes are ggml's dimensions reversed
    w.add_tensor("v.patch_embd.weight", rand(n_embd, 3, patch_size, patch_size, dtype=np.float16))
    w.add_tensor("v.patch_embd.bias", rand(n_embd))
    w.add_tensor("v.position_embd.weight", rand(n_patches, n_embd))
    w.add_tensor("v.blk.0.attn_out.weight", rand(n_embd, n_embd))
    w.add_tensor("v.blk.0.ffn_up.weight", rand(n_ff, n_embd))
    w.add_tensor("v.blk.0.ffn_down.weight", rand(n_embd, n_ff))
    w.add_tensor("mm.0.weight", rand(hidden, n_embd))
    w.add_tensor("mm.0.bias", rand(hidden))
    w.add_tensor("mm.2.weight", rand(n_embd_text, hidden))
    w.add_tensor("mm.2.bias", rand(n_embd_text))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n_patches
