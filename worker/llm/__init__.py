"""The ChatModels behind planner's seam (``planner.llm.ChatModel``): an OpenAI-compatible
HTTP client, the embedded local model (``worker.llm.embedded``: on numpy and llguidance, or on
llama-cpp-python), and a primary / fallback pair of any two. ``worker.llm.chat_models`` builds
the worker's from its settings.

The names are resolved lazily, so ``import worker.llm`` imports neither httpx nor a
model runtime; the local models import theirs only when they first load the model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.llm.embedded.local import LocalLlamaChatModel
    from worker.llm.embedded.local_numpy import LocalNumpyChatModel
    from worker.llm.embedded.local_runtime import embedded_chat_model
    from worker.llm.fallback import FallbackChatModel
    from worker.llm.openai_compat import OpenAICompatibleChatModel

__all__ = [
    "FallbackChatModel",
    "LocalLlamaChatModel",
    "LocalNumpyChatModel",
    "OpenAICompatibleChatModel",
    "embedded_chat_model",
]

_MODULES = {
    "FallbackChatModel": "worker.llm.fallback",
    "LocalLlamaChatModel": "worker.llm.embedded.local",
    "LocalNumpyChatModel": "worker.llm.embedded.local_numpy",
    "embedded_chat_model": "worker.llm.embedded.local_runtime",
    "OpenAICompatibleChatModel": "worker.llm.openai_compat",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
