"""ChatModel implementations: an OpenAI-compatible HTTP client, the embedded local model (on
llama-cpp-python or on numpy and llguidance), and a primary / fallback pair of any two.

The names are resolved lazily, so ``import planner.providers`` imports neither httpx nor a
model runtime; the local models import theirs only when they first load the model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.providers.fallback import FallbackChatModel
    from planner.providers.local import LocalLlamaChatModel
    from planner.providers.local_numpy import LocalNumpyChatModel
    from planner.providers.local_runtime import embedded_chat_model
    from planner.providers.openai_compat import OpenAICompatibleChatModel

__all__ = [
    "FallbackChatModel",
    "LocalLlamaChatModel",
    "LocalNumpyChatModel",
    "OpenAICompatibleChatModel",
    "embedded_chat_model",
]

_MODULES = {
    "FallbackChatModel": "planner.providers.fallback",
    "LocalLlamaChatModel": "planner.providers.local",
    "LocalNumpyChatModel": "planner.providers.local_numpy",
    "embedded_chat_model": "planner.providers.local_runtime",
    "OpenAICompatibleChatModel": "planner.providers.openai_compat",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
