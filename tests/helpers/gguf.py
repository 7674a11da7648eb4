"""A tiny Llama GGUF file written from scratch, for the GGUF cache and header tests."""

from __future__ import annotations

import numpy as np


def write_tiny_llama_gguf(path) -> None:
    """A one-layer Llama GGUF (d_model 16, two heads, vocabulary 11, float32 tensors, no tokenizer)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(64)
    writer.add_embedding_length(16)
    writer.add_block_count(1)
    writer.add_feed_forward_length(24)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(8)
    writer.add_vocab_size(11)
    rng = np.random.default_rng(0)
    shapes = {"token_embd": (11, 16), "output_norm": (16,), "blk.0.attn_q": (16, 16), "blk.0.attn_k": (16, 16),
              "blk.0.attn_v": (16, 16), "blk.0.attn_output": (16, 16), "blk.0.ffn_gate": (24, 16),
              "blk.0.ffn_up": (24, 16), "blk.0.ffn_down": (16, 24), "blk.0.attn_norm": (16,),
              "blk.0.ffn_norm": (16,)}  # fmt: skip
    for name, shape in shapes.items():
        writer.add_tensor(f"{name}.weight", (rng.standard_normal(shape) * 0.2).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
