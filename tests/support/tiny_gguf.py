"""A tiny random-weight llama-architecture GGUF model (~0.5 MB) that llama.cpp loads and serves at once.

By default (``TINY``) 2 layers, embedding 64, 4 heads, feed-forward 128, context 512, f32 weights; a
298-token SPM vocabulary (3 control tokens, 256 byte tokens, a few pieces) and a Jinja chat template, so
``/v1/chat/completions`` works (the text is gibberish; the protocol, streaming and usage accounting are
real). Larger ``Dimensions`` make a model whose prompt processing takes measurable time (the prompt-cache
benchmark). Used by the local-serve integration tests, the benchmarks and ``scripts/demo``:

    python -m support.tiny_gguf OUT.gguf [--seed N] [--embd 64 --layers 2 --ff 128 --ctx 512]
                                                          (from the tests directory)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class Dimensions:
    """The model's shape (4 attention heads, as many KV heads)."""

    embd: int = 64
    layers: int = 2
    ff: int = 128
    ctx: int = 512
    heads: int = 4

    @property
    def head_dim(self) -> int:
        return self.embd // self.heads


TINY = Dimensions()
PIECES = ["▁", *(chr(c) for c in range(ord("a"), ord("z") + 1)), "▁hello", "▁world", "▁the", "▁a", "▁user",
          "▁assistant", "▁system", ":", ".", ",", "!", "?"]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def vocabulary() -> tuple[list[bytes], list[float], list[int]]:
    """Tokens, scores and token types of the tiny SPM vocabulary."""
    tokens: list[bytes] = [b"<unk>", b"<s>", b"</s>"]
    scores: list[float] = [0.0, 0.0, 0.0]
    types: list[int] = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for byte in range(256):
        tokens.append(f"<0x{byte:02X}>".encode())
        scores.append(0.0)
        types.append(gguf.TokenType.BYTE)
    for index, piece in enumerate(PIECES):
        tokens.append(piece.encode())
        scores.append(-float(index + 1))
        types.append(gguf.TokenType.NORMAL)
    return tokens, scores, types


def _write_header(writer: gguf.GGUFWriter, vocab_size: int, dims: Dimensions) -> None:
    writer.add_name("tiny-random-llama")
    writer.add_context_length(dims.ctx)
    writer.add_embedding_length(dims.embd)
    writer.add_block_count(dims.layers)
    writer.add_feed_forward_length(dims.ff)
    writer.add_head_count(dims.heads)
    writer.add_head_count_kv(dims.heads)
    writer.add_rope_dimension_count(dims.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)


def _write_tokenizer(writer: gguf.GGUFWriter, tokens: list[bytes], scores: list[float], types: list[int]) -> None:
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def _write_tensors(writer: gguf.GGUFWriter, vocab_size: int, rng: np.random.Generator, dims: Dimensions) -> None:
    def random(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    def ones(name: str) -> None:
        writer.add_tensor(name, np.ones(dims.embd, dtype=np.float32))

    embd, ff = dims.embd, dims.ff
    random("token_embd.weight", vocab_size, embd)
    ones("output_norm.weight")
    random("output.weight", vocab_size, embd)
    for i in range(dims.layers):
        ones(f"blk.{i}.attn_norm.weight")
        ones(f"blk.{i}.ffn_norm.weight")
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            random(f"blk.{i}.{name}.weight", embd, embd)
        random(f"blk.{i}.ffn_gate.weight", ff, embd)
        random(f"blk.{i}.ffn_up.weight", ff, embd)
        random(f"blk.{i}.ffn_down.weight", embd, ff)


def write_tiny_gguf(path: str | Path, seed: int = 0, dims: Dimensions = TINY) -> Path:
    """Write the model to ``path`` (parent directories created); different seeds give different weights."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokens, scores, types = vocabulary()
    writer = gguf.GGUFWriter(str(out), arch="llama")
    _write_header(writer, len(tokens), dims)
    _write_tokenizer(writer, tokens, scores, types)
    _write_tensors(writer, len(tokens), np.random.default_rng(seed), dims)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.tiny_gguf", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the .gguf file to write")
    parser.add_argument("--seed", type=int, default=0)
    for name in ("embd", "layers", "ff", "ctx"):
        parser.add_argument(f"--{name}", type=int, default=getattr(TINY, name))
    args = parser.parse_args(argv)
    dims = Dimensions(embd=args.embd, layers=args.layers, ff=args.ff, ctx=args.ctx)
    print(write_tiny_gguf(args.out, args.seed, dims))
    return 0


if __name__ == "__main__":
    sys.exit(main())
