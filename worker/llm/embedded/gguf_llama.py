"""A Llama-architecture GGUF model's forward pass in numpy: the embedded model's runtime from
prebuilt wheels (``gguf`` reads and dequantizes the file, numpy's BLAS does the matmuls).

The architecture is llama.cpp's ``llama`` (``src/llama-model.cpp``, ``LLM_ARCH_LLAMA``): token
embedding, ``block_count`` blocks of RMSNorm → attention (grouped-query, rotary position
embedding in llama.cpp's "normal" mode: adjacent pairs rotated, as the GGUF converter permutes
Q and K for) → residual → RMSNorm → SwiGLU MLP → residual, a final RMSNorm and the output
projection (``output.weight``, or the token embedding when the model ties them, as
SmolLM2 does). Every figure (heads, KV heads, RoPE base, RMS epsilon, sizes) comes from the
file's ``llama.*`` metadata.

Weights are dequantized to float32 once, at load (SmolLM2-135M: 0.54 GB); the prompt is run
through every layer at once (matrix-matrix products), each later token alone against a KV
cache (matrix-vector products). Only the logits that are asked for are computed: the
constrained decoder often allows a handful of tokens out of 49,152.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf import GGUFReader
from gguf.quants import dequantize

__all__ = ["LlamaConfig", "LlamaModel", "PlainGGUFReader", "read_config"]

Floats = npt.NDArray[np.float32]


class PlainGGUFReader(GGUFReader):
    """``gguf.GGUFReader`` on a plain ndarray view of its memory-mapped file.

    The reader slices ``data`` (an ``np.memmap``) for every part of every field, about a
    quarter of a million times for SmolLM2's 49,152 tokens and 48,900 merges, and every slice of
    a memmap is a new memmap (``memmap.__array_finalize__``). On a plain view of the same
    mapping (``np.asarray``) the fields and tensors are the same and reading them took 5.1 s
    instead of 18.0 s (2 loaded cores); the file stays mapped, not read into memory.
    """

    @property  # type: ignore[override]
    def data(self) -> npt.NDArray[np.uint8]:
        """The file's bytes (a view of the read-only mapping)."""
        return self._plain

    @data.setter
    def data(self, value: npt.NDArray[np.uint8]) -> None:
        self._plain: npt.NDArray[np.uint8] = np.asarray(value)


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama-architecture model's shape, from its GGUF metadata (``llama.*`` keys).

    Attributes:
        n_layers: transformer blocks (``llama.block_count``).
        n_embd: hidden size (``llama.embedding_length``).
        n_heads: query heads (``llama.attention.head_count``).
        n_kv_heads: key/value heads (``llama.attention.head_count_kv``; grouped-query attention
            when fewer than ``n_heads``).
        rope_base: RoPE frequency base (``llama.rope.freq_base``; 10000 when absent).
        rms_eps: RMSNorm epsilon (``llama.attention.layer_norm_rms_epsilon``).
        n_vocab: vocabulary size (rows of the token embedding).
    """

    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    rope_base: float
    rms_eps: float
    n_vocab: int

    @property
    def head_dim(self) -> int:
        """Dimensions per attention head (``n_embd / n_heads``)."""
        return self.n_embd // self.n_heads


def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"the GGUF file has no {key}")
        return default
    return field.contents()


def read_config(reader: GGUFReader) -> LlamaConfig:
    """The model's shape from an open GGUF file.

    Raises:
        ValueError: the file is not a ``llama`` model, or a required key is missing.
    """
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"the numpy runtime runs llama-architecture models, not {arch!r}")
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return LlamaConfig(
        n_layers=int(_field(reader, "llama.block_count")),
        n_embd=int(_field(reader, "llama.embedding_length")),
        n_heads=int(_field(reader, "llama.attention.head_count")),
        n_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        rope_base=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        n_vocab=int(embd.shape[-1]),
    )


@dataclass(frozen=True)
class _Layer:
    attn_norm: Floats  # (n_embd,)
    wqkv: Floats  # (n_embd + 2 * kv_dim, n_embd): Q, K and V stacked
    wo: Floats  # (n_embd, n_embd)
    ffn_norm: Floats  # (n_embd,)
    w_gate_up: Floats  # (2 * n_ff, n_embd): gate and up stacked
    w_down: Floats  # (n_embd, n_ff)


def _rms_norm(x: Floats, weight: Floats, eps: float) -> Floats:
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    normed: Floats = (x * scale * weight).astype(np.float32, copy=False)
    return normed


class LlamaModel:
    """A Llama-architecture GGUF model with a KV cache of ``n_ctx`` positions.

    ``eval(tokens)`` appends tokens to the cache and returns the last one's hidden state;
    ``logits(hidden, ids)`` projects it onto the vocabulary (or onto ``ids`` only).
    ``truncate(n)`` forgets all positions from ``n`` on (to reuse a shared prompt prefix).
    Not thread-safe: one sequence, one caller at a time.

    Args:
        source: the GGUF file, or a ``GGUFReader`` of it already open.
        n_ctx: positions in the KV cache (default 2048).

    Raises:
        ValueError: the file is no llama-architecture model or lacks a tensor this needs.
        OSError: the file cannot be read.
        NotImplementedError: a tensor type that ``gguf`` cannot dequantize.
    """

    def __init__(self, source: GGUFReader | str | Path, *, n_ctx: int = 2048) -> None:
        reader = source if isinstance(source, GGUFReader) else PlainGGUFReader(str(source))
        self.config = config = read_config(reader)
        self.n_ctx = n_ctx
        tensors = {t.name: t for t in reader.tensors}

        def weight(name: str) -> Floats:
            tensor = tensors.get(name)
            if tensor is None:
                raise ValueError(f"the GGUF file has no tensor {name}")
            # a plain view (see PlainGGUFReader): gguf slices it block group by block group
            array = dequantize(np.asarray(tensor.data), tensor.tensor_type)
            shape = tuple(int(n) for n in reversed(tensor.shape))  # ggml lists ne0 first
            if not array.flags.owndata and array.base is not None:
                array = array.copy()  # a float32 tensor is a view of the file: not kept mapped
            return np.ascontiguousarray(array.reshape(shape), dtype=np.float32)

        self.token_embd = weight("token_embd.weight")  # (n_vocab, n_embd)
        self.output = weight("output.weight") if "output.weight" in tensors else self.token_embd
        self.output_norm = weight("output_norm.weight")
        self.layers: list[_Layer] = []
        for i in range(config.n_layers):
            p = f"blk.{i}."
            self.layers.append(
                _Layer(
                    attn_norm=weight(p + "attn_norm.weight"),
                    wqkv=np.concatenate(
                        [
                            weight(p + "attn_q.weight"),
                            weight(p + "attn_k.weight"),
                            weight(p + "attn_v.weight"),
                        ]
                    ),
                    wo=weight(p + "attn_output.weight"),
                    ffn_norm=weight(p + "ffn_norm.weight"),
                    w_gate_up=np.concatenate(
                        [weight(p + "ffn_gate.weight"), weight(p + "ffn_up.weight")]
                    ),
                    w_down=weight(p + "ffn_down.weight"),
                )
            )
        kv_dim = config.n_kv_heads * config.head_dim
        shape = (config.n_layers, n_ctx, config.n_kv_heads, config.head_dim)
        self._k = np.zeros(shape, dtype=np.float32)
        self._v = np.zeros(shape, dtype=np.float32)
        self._kv_dim = kv_dim
        half = config.head_dim // 2
        freqs = config.rope_base ** (-np.arange(half, dtype=np.float64) * 2.0 / config.head_dim)
        angles = np.outer(np.arange(n_ctx, dtype=np.float64), freqs)
        self._cos = np.cos(angles).astype(np.float32)[:, None, :]  # (n_ctx, 1, half)
        self._sin = np.sin(angles).astype(np.float32)[:, None, :]
        self.n_past = 0
        """Positions filled in the KV cache."""

    def truncate(self, n_past: int) -> None:
        """Forget every cached position from ``n_past`` on (0 clears the cache)."""
        self.n_past = max(0, min(n_past, self.n_past))

    def eval(self, tokens: list[int]) -> Floats:
        """Run ``tokens`` at the next positions; returns the last token's final hidden state
        (after the output norm), shape ``(n_embd,)``.

        Raises:
            ValueError: the cache would exceed ``n_ctx`` positions, or ``tokens`` is empty.
        """
        if not tokens:
            raise ValueError("no tokens to evaluate")
        start, count = self.n_past, len(tokens)
        if start + count > self.n_ctx:
            raise ValueError(
                f"the prompt and reply need {start + count} tokens; the context holds {self.n_ctx}"
            )
        cfg = self.config
        x: Any = self.token_embd[np.asarray(tokens, dtype=np.intp)]  # (T, n_embd), float32
        cos, sin = self._cos[start : start + count], self._sin[start : start + count]
        groups, per_group, dim = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
        # causal mask: query t (position start + t) sees keys 0 .. start + t
        mask = None
        if count > 1:
            keys = np.arange(start + count)
            queries = np.arange(start, start + count)
            mask = np.where(keys[None, :] > queries[:, None], -np.inf, 0.0).astype(np.float32)
            mask = np.tile(mask, (per_group, 1))  # rows ordered (head in group, token)
        scale = np.float32(1.0 / np.sqrt(dim))
        end = start + count
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.attn_norm, cfg.rms_eps)
            qkv = h @ layer.wqkv.T
            q = qkv[:, : cfg.n_embd].reshape(count, cfg.n_heads, dim)
            k = qkv[:, cfg.n_embd : cfg.n_embd + self._kv_dim].reshape(count, groups, dim)
            v = qkv[:, cfg.n_embd + self._kv_dim :].reshape(count, groups, dim)
            self._k[i, start:end] = _rope(k, cos, sin)
            self._v[i, start:end] = v
            q = _rope(q, cos, sin)
            # (groups, per_group * T, dim): the query heads that share a KV head, token-minor
            q_groups = (
                q.reshape(count, groups, per_group, dim)
                .transpose(1, 2, 0, 3)
                .reshape(groups, per_group * count, dim)
            )
            keys_g = self._k[i, :end].transpose(1, 2, 0)  # (groups, dim, S)
            scores = (q_groups @ keys_g) * scale  # (groups, per_group * T, S)
            if mask is not None:
                scores += mask
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            out = scores @ self._v[i, :end].transpose(1, 0, 2)  # (groups, per_group * T, dim)
            out = out.reshape(groups, per_group, count, dim).transpose(2, 0, 1, 3)
            x = x + out.reshape(count, cfg.n_embd) @ layer.wo.T
            h = _rms_norm(x, layer.ffn_norm, cfg.rms_eps)
            gate_up = h @ layer.w_gate_up.T
            n_ff = gate_up.shape[1] // 2
            gate, up = gate_up[:, :n_ff], gate_up[:, n_ff:]
            swiglu = (gate / (1.0 + np.exp(-gate))).astype(np.float32, copy=False) * up
            x = x + swiglu @ layer.w_down.T
        self.n_past = end
        return _rms_norm(x[-1], self.output_norm, cfg.rms_eps)

    def logits(self, hidden: Floats, ids: npt.NDArray[np.intp] | None = None) -> Floats:
        """Logits of the next token: shape ``(n_vocab,)``, or ``(len(ids),)`` for ``ids`` only
        (then the cost is that of ``len(ids)`` rows of the output projection)."""
        if ids is None:
            return self.output @ hidden
        return self.output[ids] @ hidden


def _rope(x: Floats, cos: Floats, sin: Floats) -> Floats:
    """Rotary position embedding, llama.cpp's normal mode: each adjacent pair ``(x[2i],
    x[2i+1])`` of a head rotated by ``position * base^(-2i/head_dim)``. ``x`` is ``(T, heads,
    head_dim)``, ``cos``/``sin`` ``(T, 1, head_dim / 2)``."""
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out
