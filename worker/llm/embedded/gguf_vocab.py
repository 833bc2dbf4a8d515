"""A GGUF model's tokenizer and chat template, rebuilt from the file's own metadata: the
tokenizer as a Hugging Face ``tokenizers.Tokenizer`` (which also feeds llguidance), the chat
template rendered with Jinja2 as llama-cpp-python renders it.

Only byte-level BPE vocabularies (``tokenizer.ggml.model = "gpt2"``) with the pre-tokenizers
below are supported; their rules are llama.cpp's (``src/llama-vocab.cpp``, ``LLAMA_VOCAB_PRE_
TYPE_*``), written as the Hugging Face pre-tokenizers the models ship with (SmolLM2's
``tokenizer.json``: single digits, then GPT-2's byte-level split).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gguf import GGUFReader
from jinja2 import BaseLoader
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

__all__ = ["CONTROL_TOKEN_TYPE", "GGUFVocab", "build_tokenizer", "read_vocab"]

CONTROL_TOKEN_TYPE = 3
"""``tokenizer.ggml.token_type`` of control tokens (gguf-py's ``TokenType.CONTROL``): matched
as whole special tokens in a prompt, never split by BPE."""

_PRE_TOKENIZERS = {
    # llama.cpp LLAMA_VOCAB_PRE_TYPE_SMOLLM: "\p{N}" then GPT-2's regex
    "smollm": lambda: pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    ),
    # llama.cpp LLAMA_VOCAB_PRE_TYPE_GPT2
    "gpt-2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
}


@dataclass(frozen=True)
class GGUFVocab:
    """A GGUF file's vocabulary and chat template (the ``tokenizer.*`` keys).

    Attributes:
        tokens: token texts by id (byte-level BPE: bytes as GPT-2's printable characters).
        token_types: ``tokenizer.ggml.token_type`` by id (``CONTROL_TOKEN_TYPE`` = special).
        merges: BPE merges, ``"left right"``, by rank.
        pre: the pre-tokenizer's name (``tokenizer.ggml.pre``).
        eos_token_id: the end-of-generation token (SmolLM2: ``<|im_end|>``, 2).
        bos_token_id: the beginning-of-sequence token.
        add_bos: whether a prompt starts with ``bos_token_id`` (``tokenizer.ggml.add_bos_token``).
        chat_template: the Jinja2 chat template (``tokenizer.chat_template``).
    """

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    eos_token_id: int
    bos_token_id: int
    add_bos: bool
    chat_template: str

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt for ``messages`` (``role``/``content`` dicts), ending with the opening of
        the assistant's turn, as llama-cpp-python's ``Jinja2ChatFormatter`` renders it
        (sandboxed Jinja2, ``trim_blocks``, ``lstrip_blocks``, ``add_generation_prompt``).

        Raises:
            ValueError: the template raised (``raise_exception``) or is not valid Jinja2.
        """

        def raise_exception(message: str) -> None:
            raise ValueError(message)

        environment = ImmutableSandboxedEnvironment(
            loader=BaseLoader(), trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
        )
        environment.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        try:
            template = environment.from_string(self.chat_template)
        except Exception as exc:
            raise ValueError(f"the GGUF chat template is not valid Jinja2: {exc}") from exc
        return template.render(
            messages=messages,
            eos_token=self.tokens[self.eos_token_id],
            bos_token=self.tokens[self.bos_token_id],
            add_generation_prompt=True,
            raise_exception=raise_exception,
        )


def _field(reader: GGUFReader, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        raise ValueError(f"the GGUF file has no {key}")
    return field.contents()


def read_vocab(reader: GGUFReader) -> GGUFVocab:
    """The vocabulary and chat template of an open GGUF file.

    Raises:
        ValueError: a key is missing, or the vocabulary is not byte-level BPE with a supported
            pre-tokenizer (``smollm``, ``gpt-2``).
    """
    model = _field(reader, "tokenizer.ggml.model")
    pre = _field(reader, "tokenizer.ggml.pre")
    if model != "gpt2" or pre not in _PRE_TOKENIZERS:
        raise ValueError(
            f"the numpy runtime reads byte-level BPE vocabularies with pre-tokenizer "
            f"{' or '.join(_PRE_TOKENIZERS)}; this file has {model!r} / {pre!r}"
        )
    add_bos = reader.fields.get("tokenizer.ggml.add_bos_token")
    return GGUFVocab(
        tokens=list(_field(reader, "tokenizer.ggml.tokens")),
        token_types=[int(t) for t in _field(reader, "tokenizer.ggml.token_type")],
        merges=list(_field(reader, "tokenizer.ggml.merges")),
        pre=str(pre),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        add_bos=bool(add_bos.contents()) if add_bos is not None else False,
        chat_template=str(_field(reader, "tokenizer.chat_template")),
    )


def build_tokenizer(vocab: GGUFVocab) -> Tokenizer:
    """A Hugging Face tokenizer equal to llama.cpp's for ``vocab``: byte-level BPE with the
    file's merges, its pre-tokenizer, and its control tokens as special tokens (matched whole
    in prompts, as llama.cpp's ``tokenize(..., special=True)`` does)."""
    bpe = models.BPE(
        vocab={text: i for i, text in enumerate(vocab.tokens)},
        merges=[(left, right) for left, _, right in (m.partition(" ") for m in vocab.merges)],
        fuse_unk=False,
        byte_fallback=False,
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = _PRE_TOKENIZERS[vocab.pre]()  # type: ignore[no-untyped-call]
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [
            AddedToken(text, special=True, normalized=False)
            for text, kind in zip(vocab.tokens, vocab.token_types, strict=True)
            if kind == CONTROL_TOKEN_TYPE
        ]
    )
    return tokenizer
