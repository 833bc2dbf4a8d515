"""A ChatModel that sends a request to a fallback endpoint when the primary fails.

"Fails" means the primary raised ``LLMError``, which an ``OpenAICompatibleChatModel`` does
only after its own retries (the endpoint stayed down, kept answering 429 / 5xx or timed out)
or at once for what retrying cannot fix (another 4xx such as 400, 401 or 404, or a reply that
is not a chat completion). Each request is tried on the primary first; there is no memory
between requests. The response's ``endpoint`` names who answered, and the loop stores it with
the round's assistant message (``ReplyInfo.endpoint``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Self

from planner.errors import LLMError
from planner.llm import ChatModel, CompletionRequest, CompletionResponse

__all__ = ["FallbackChatModel"]

logger = logging.getLogger(__name__)


class FallbackChatModel:
    """Ask ``primary``; when it raises ``LLMError``, ask ``fallback`` the same request.

    Args:
        primary: the chat model tried first.
        fallback: the chat model tried when the primary fails.
        fallback_model: the model name sent to the fallback in place of the request's (the two
            endpoints usually name their models differently); ``None`` keeps the request's.
        on_fallback: called with the primary's error each time a request goes to the
            fallback (for a log line or a metric).

    Raises (from ``complete``):
        LLMError: both failed; the message gives both errors, ``usage`` sums what both
            reported.

    Use ``async with`` or call ``aclose()`` to close both models.
    """

    def __init__(
        self,
        primary: ChatModel,
        fallback: ChatModel,
        *,
        fallback_model: str | None = None,
        on_fallback: Callable[[LLMError], None] | None = None,
    ) -> None:
        self.primary = primary
        self.fallback = fallback
        self.fallback_model = fallback_model
        self._on_fallback = on_fallback

    async def complete(self, request: CompletionRequest) -> CompletionResponse:
        """The primary's response, or the fallback's when the primary fails (see the class)."""
        try:
            return await self.primary.complete(request)
        except LLMError as primary_error:
            failed = primary_error
        if self._on_fallback is not None:
            self._on_fallback(failed)
        logger.warning("primary LLM endpoint failed, asking the fallback: %s", failed)
        if self.fallback_model is not None:
            request = request.model_copy(update={"model": self.fallback_model})
        try:
            response = await self.fallback.complete(request)
        except LLMError as exc:
            raise LLMError(
                f"{failed}; then the fallback endpoint failed too: {exc}",
                usage=failed.usage + exc.usage,
            ) from exc
        return response.model_copy(update={"usage": response.usage + failed.usage})

    async def aclose(self) -> None:
        """Close both models when they hold resources (HTTP clients)."""
        for model in (self.primary, self.fallback):
            close = getattr(model, "aclose", None)
            if close is not None:
                await close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
