"""Which runtime runs the embedded model: llama-cpp-python (``LocalLlamaChatModel``, compiled
on install) or numpy with llguidance (``LocalNumpyChatModel``, prebuilt wheels). Both run the
same GGUF file with the same prompt, reply schema and repeat penalty."""

from __future__ import annotations

import importlib.util
from typing import Literal

from planner.llm import ChatModel

__all__ = ["LocalRuntime", "embedded_chat_model", "resolve_local_runtime"]

LocalRuntime = Literal["auto", "numpy", "llama-cpp"]


def resolve_local_runtime(runtime: LocalRuntime) -> Literal["numpy", "llama-cpp"]:
    """``runtime``, with ``"auto"`` resolved: ``"llama-cpp"`` when llama-cpp-python is
    installed (it is the faster one), else ``"numpy"``."""
    if runtime != "auto":
        return runtime
    return "llama-cpp" if importlib.util.find_spec("llama_cpp") is not None else "numpy"


def embedded_chat_model(runtime: LocalRuntime = "auto") -> ChatModel:
    """The embedded model's ChatModel on ``runtime`` (see ``resolve_local_runtime``). Nothing
    is imported or loaded until its first request, which raises ``LLMError`` with the install
    command when the runtime's packages are missing."""
    if resolve_local_runtime(runtime) == "llama-cpp":
        from worker.llm.embedded.local import LocalLlamaChatModel

        return LocalLlamaChatModel()
    from worker.llm.embedded.local_numpy import LocalNumpyChatModel

    return LocalNumpyChatModel()
