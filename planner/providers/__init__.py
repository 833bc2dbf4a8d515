"""ChatModel implementations: an OpenAI-compatible HTTP client, the embedded local model, and
a primary / fallback pair of any two.

The names are resolved lazily, so ``import planner.providers`` imports neither httpx nor
llama_cpp; ``LocalLlamaChatModel`` imports llama_cpp only when it first loads the model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.providers.fallback import FallbackChatModel
    from planner.providers.local import LocalLlamaChatModel
    from planner.providers.openai_compat import OpenAICompatibleChatModel

__all__ = ["FallbackChatModel", "LocalLlamaChatModel", "OpenAICompatibleChatModel"]

_MODULES = {
    "FallbackChatModel": "planner.providers.fallback",
    "LocalLlamaChatModel": "planner.providers.local",
    "OpenAICompatibleChatModel": "planner.providers.openai_compat",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
