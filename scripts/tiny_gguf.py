#!/usr/bin/env python3
"""Write a tiny Llama as GGUF for llama.cpp's server, made here: nothing is downloaded.

    python scripts/tiny_gguf.py OUT.gguf

The shapes are the embedded `tiny-llama`'s (pytest_llmperf/backends/models.py: hidden 384, 6 layers,
6 heads, 2 KV heads, FFN 1024); the weights are seeded random (timing depends on shapes, not
weights). The tokenizer is a SentencePiece-style ("llama") vocabulary llama.cpp can run: the
specials, every printable ASCII character with and without the word-start mark "▁", and each
word of the embedded prompt text with all its prefixes, scored so longer pieces merge first. A
prompt word is then one token, and any ASCII text tokenizes; every generated token but the
specials decodes to visible text, so a streamed chunk is never empty.
Needs numpy and the `gguf` package (llama.cpp's own writer, on PyPI).
"""

from __future__ import annotations

import argparse
import string
import sys
from pathlib import Path

import numpy as np

# tiny-llama's shapes (pytest_llmperf/backends/models.py, _tiny_llama); kept here so torch is not needed
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, CONTEXT = 384, 6, 6, 2, 1024, 4096
SPECIALS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: unknown, BOS, EOS
SPACE = "\u2581"  # SentencePiece's word-start mark


def vocabulary(words: list[str]) -> tuple[list[str], list[float]]:
    """Pieces and scores: specials, single characters, then each word's "▁"-prefixed prefixes."""
    chars = [c for c in string.printable if c not in string.whitespace or c == " "]
    pieces = list(SPECIALS) + [SPACE] + [c for c in chars if c != " "] + [SPACE + c for c in chars if c != " "]
    seen = set(pieces)
    for word in words:
        for end in range(2, len(word) + 1):
            piece = SPACE + word[:end]
            if piece not in seen:
                seen.add(piece)
                pieces.append(piece)
    scores = [0.0] * len(SPECIALS) + [float(len(p)) for p in pieces[len(SPECIALS):]]  # longer merges first
    return pieces, scores


def write(path: Path, seed: int = 0) -> Path:
    import gguf

    from pytest_llmperf.measure.scenario import PROMPT_TEXT  # the prompts' words (no torch at import)

    pieces, scores = vocabulary(sorted(set(PROMPT_TEXT.split())))
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + \
        [gguf.TokenType.NORMAL] * (len(pieces) - len(SPECIALS))

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama (pytest-llmperf, random weights)")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)

    rng = np.random.default_rng(seed)

    def tensor(name: str, *shape: int, norm: bool = False) -> None:
        data = np.ones(shape, np.float32) if norm else (rng.standard_normal(shape, np.float32) * 0.02)
        writer.add_tensor(name, data)

    head_dim = HIDDEN // HEADS
    tensor("token_embd.weight", len(pieces), HIDDEN)
    for i in range(LAYERS):
        tensor(f"blk.{i}.attn_norm.weight", HIDDEN, norm=True)
        tensor(f"blk.{i}.attn_q.weight", HEADS * head_dim, HIDDEN)
        tensor(f"blk.{i}.attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        tensor(f"blk.{i}.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        tensor(f"blk.{i}.attn_output.weight", HIDDEN, HEADS * head_dim)
        tensor(f"blk.{i}.ffn_norm.weight", HIDDEN, norm=True)
        tensor(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        tensor(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    tensor("output_norm.weight", HIDDEN, norm=True)
    tensor("output.weight", len(pieces), HIDDEN)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(write(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
