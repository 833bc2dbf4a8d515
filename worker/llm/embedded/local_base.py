"""What the embedded model's two runtimes share (``LocalLlamaChatModel``,
``LocalNumpyChatModel``): their options, and how a request reaches the model — in a worker
thread, one at a time, under a lock held for the whole inference.

A runtime says how to answer a request (``_complete_sync``, in the thread, under the lock)
and how to free its model (``_free``, likewise); everything else is here.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

from planner.llm import CompletionRequest, CompletionResponse
from worker.llm.embedded.local_grammar import DEFAULT_MAX_TOOL_CALLS
from worker.llm.embedded.local_reply import call_ids

__all__ = [
    "DEFAULT_MAX_TOOL_ROUNDS",
    "DEFAULT_REPEAT_PENALTY",
    "DEFAULT_TEMPERATURE",
    "LocalChatModelBase",
]

DEFAULT_MAX_TOOL_ROUNDS = 2
"""Tool-calling replies per turn before the model must answer. SmolLM2-135M never chooses the
answer while a tool is on offer: with the 7 built-in tools it walked through all of them
(notes_update, notes_delete, ...) until the loop's max_rounds."""

DEFAULT_TEMPERATURE = 0.0
"""Greedy decoding: with a 135M model, sampling mostly adds wrong tool choices."""

DEFAULT_REPEAT_PENALTY = 1.15
"""Without it, greedy SmolLM2-135M repeats a sentence until the string limit ("This is a note.
This is a note. ..."); 1.3 makes it write empty strings. Measured on the first-run mission."""


class LocalChatModelBase:
    """The options of an embedded-model ChatModel and its request path (see the runtimes'
    docstrings for each option; the defaults are the module's constants).

    Raises:
        ValueError: ``max_tool_calls`` below 1.
    """

    _MODEL_NAME = "SmolLM2-135M-Instruct"
    """How errors name the model when no ``model_path`` was given."""

    def __init__(
        self,
        *,
        model_path: str | Path | None = None,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        seed: int = 0,
        max_tokens: int = 256,
        temperature: float = DEFAULT_TEMPERATURE,
        repeat_tools: bool = False,
        max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS,
        repeat_penalty: float = DEFAULT_REPEAT_PENALTY,
        max_tool_rounds: int | None = DEFAULT_MAX_TOOL_ROUNDS,
    ) -> None:
        if max_tool_calls < 1:
            raise ValueError(f"max_tool_calls must be >= 1, got {max_tool_calls}")
        self.model_path = Path(model_path) if model_path is not None else None
        self.n_ctx = n_ctx
        self.n_threads = n_threads or max((os.cpu_count() or 1) // 2, 1)
        self.seed = seed
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.repeat_tools = repeat_tools
        self.max_tool_calls = max_tool_calls
        self.repeat_penalty = repeat_penalty
        self.max_tool_rounds = max_tool_rounds
        self._grammars: dict[str, Any] = {}
        # Held by the worker thread for the whole of an inference and for close(): a cancelled
        # ``complete()`` cannot stop its thread, and freeing the model under a running inference
        # crashes the process (SIGSEGV). An asyncio lock would be released on cancellation.
        self._lock = threading.Lock()
        self._ids = call_ids()

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        """Answer ``request`` with a grammar-forced tool call or text answer.

        Raises:
            LLMError, LLMResponseError: see the runtime's class docstring.
        """
        return await asyncio.to_thread(self._complete_locked, request)

    async def aclose(self) -> None:
        """Free the model (it is loaded again on the next request). Waits for an inference
        still running in its thread (e.g. of a cancelled ``complete()``) to finish first."""
        await asyncio.to_thread(self._close_locked)

    # -- runs in a worker thread, under the lock -----------------------------------------------

    def _complete_locked(self, request: CompletionRequest) -> CompletionResponse:
        with self._lock:
            return self._complete_sync(request)

    def _close_locked(self) -> None:
        with self._lock:
            self._grammars.clear()
            self._free()

    def _complete_sync(self, request: CompletionRequest) -> CompletionResponse:
        raise NotImplementedError

    def _free(self) -> None:
        raise NotImplementedError

    def _temperature(self, request: CompletionRequest) -> float:
        """The request's temperature, else this model's."""
        return request.temperature if request.temperature is not None else self.temperature

    def _path_text(self) -> str:
        return str(self.model_path) if self.model_path is not None else self._MODEL_NAME
