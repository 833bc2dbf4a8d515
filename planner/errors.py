"""Exceptions raised by the planner for the operator (never shown to the model).

Tree::

    ManaAIError                   root of every failure mana-ai raises on purpose (the
    │                             worker's tree, ``worker.errors``, hangs below it too)
    └── PlannerError
        ├── LLMError              the chat model could not produce a usable completion
        │   ├── LLMConnectionError    connect / read failure, timeout (after retries)
        │   ├── LLMStatusError        the endpoint answered a non-2xx status (after retries)
        │   └── LLMResponseError      the endpoint answered something unusable (a 2xx that
        │                             is no chat completion, an answer that is not HTTP)
        ├── ToolRegistryError     a tool registry was built wrong (duplicate name, schema)
        ├── CompactionError       compaction could not fold the history (planner.compaction)
        ├── ToolError             raised by a tool handler: its message is the call's error
        └── RunInterrupted        the run cannot go on for a reason that is not the model's
                                  (its database is unreachable): it stops, to resume later

Inside ``worker.llm`` three more (``BodyTooLarge``, ``BodyNotDecodable``, ``ErrorReply``)
are ``PlannerError`` subclasses that never leave it: the provider turns them into an ``LLMError``.

Tool failures are *not* exceptions at this level: an unknown tool, invalid arguments or a
handler that raises become an error tool result that the model reads (see ``planner.execution``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the error tree loads without pydantic (the CLI's start: worker.errors)
    from planner.messages import TokenUsage

__all__ = [
    "LLMConnectionError",
    "LLMError",
    "LLMResponseError",
    "LLMStatusError",
    "ManaAIError",
    "PlannerError",
    "RunInterrupted",
    "ToolError",
    "ToolRegistryError",
]


class ManaAIError(Exception):
    """Root of every failure mana-ai raises on purpose; the message is for the operator and
    names the offending value. Defined here, the lowest layer, so that the planner's and the
    worker's trees share it (``worker.errors`` re-exports it)."""


class PlannerError(ManaAIError):
    """Root of every exception the planner raises on purpose."""


class LLMError(PlannerError):
    """The chat model could not produce a usable completion.

    The message says what the endpoint did (status, body excerpt, or the transport error);
    it is stored verbatim as the iteration's error.

    Attributes:
        usage: tokens the endpoint reported as spent on the failed request (an error or an
            unusable reply can still be billed); zero when it reported none.
    """

    def __init__(self, message: str, *, usage: TokenUsage | None = None) -> None:
        super().__init__(message)
        if usage is None:
            from planner.messages import TokenUsage

            usage = TokenUsage()
        self.usage = usage


class LLMConnectionError(LLMError):
    """The endpoint could not be reached, or did not answer in time, after all retries."""


class LLMStatusError(LLMError):
    """The endpoint answered a non-2xx HTTP status (after retries, for retryable ones).

    Attributes:
        status_code: the HTTP status of the last answer.
        body: the first 500 characters of the last answer's body.
    """

    def __init__(
        self, message: str, *, status_code: int, body: str, usage: TokenUsage | None = None
    ) -> None:
        super().__init__(message, usage=usage)
        self.status_code = status_code
        self.body = body


class LLMResponseError(LLMError):
    """The endpoint answered something unusable: a 2xx whose body is not a usable chat
    completion, or an answer the HTTP client could not read at all (not valid HTTP)."""


class ToolRegistryError(PlannerError):
    """A tool registry was built wrong: a duplicate tool name or an invalid JSON schema."""


class ToolError(PlannerError):
    """Raised by a tool handler (or executor) whose failure already has the words the model
    should read: the call's error is ``str(exc)`` verbatim. Any other exception becomes
    ``"<tool> failed: <message>"`` (plain words: the class name goes to the log, not to the
    model). The tools' own errors (``WebFetchError``, ``URLRefusedError``, ``McpToolError``)
    are ``ToolError`` subclasses."""


class RunInterrupted(PlannerError):
    """The run must stop now, for a reason that is not the model's to handle: what it needs
    to go on safely (the journal a write is recorded in, the gate's rate-limit ledger, a
    tool's own database) stayed unreachable.

    Raised by a ``CallJournal``, a ``CallLedger`` (through the gate, in ``enforce``) or a tool
    handler. The loop never turns it into a tool result: it propagates out of
    ``run_planner_loop`` (cancelling the calls still running), and the caller resumes the run
    later from its last checkpoint, where a call that never started runs then. The message is
    for the operator (it is stored as the iteration's error) and names the cause.
    """
