"""mana-ai's planner: the agent loop core (LLM ↔ tools), importable and testable on its own.

The public surface is pinned by ``tests/unit/test_public_api.py``.
"""

from planner.compaction import (
    Compaction,
    CompactionError,
    Compactor,
    compact_history,
    should_compact,
)
from planner.errors import (
    LLMConnectionError,
    LLMError,
    LLMResponseError,
    LLMStatusError,
    PlannerError,
    RunInterrupted,
    ToolError,
    ToolRegistryError,
)
from planner.execution import CallJournal, ExecutedCall, execute_calls, tool_result_message
from planner.llm import ChatModel, CompletionRequest, CompletionResponse
from planner.loop import (
    Checkpoint,
    LoopState,
    PlannerLoopInput,
    PlannerLoopResult,
    ReminderChannel,
    StopReason,
    format_reminder,
    run_planner_loop,
)
from planner.messages import (
    ChatMessage,
    ReplyInfo,
    TokenUsage,
    ToolCall,
    messages_from_json,
    messages_to_json,
)
from planner.policy import (
    CallLedger,
    PolicyConfig,
    PolicyDecision,
    PolicyGate,
    PolicyInput,
    PolicyMode,
    RateLimit,
    Reservation,
    RulePolicyGate,
    UserPolicySettings,
    evaluate_policy,
)
from planner.tools import PolicyHint, ToolContext, ToolRegistry, ToolSpec

__all__ = [
    "CallJournal",
    "CallLedger",
    "ChatMessage",
    "ChatModel",
    "Checkpoint",
    "Compaction",
    "CompactionError",
    "Compactor",
    "CompletionRequest",
    "CompletionResponse",
    "ExecutedCall",
    "LLMConnectionError",
    "LLMError",
    "LLMResponseError",
    "LLMStatusError",
    "LoopState",
    "PlannerError",
    "PlannerLoopInput",
    "PlannerLoopResult",
    "PolicyConfig",
    "PolicyDecision",
    "PolicyGate",
    "PolicyHint",
    "PolicyInput",
    "PolicyMode",
    "RateLimit",
    "ReminderChannel",
    "ReplyInfo",
    "Reservation",
    "RulePolicyGate",
    "RunInterrupted",
    "StopReason",
    "TokenUsage",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "ToolRegistryError",
    "ToolSpec",
    "UserPolicySettings",
    "compact_history",
    "evaluate_policy",
    "execute_calls",
    "format_reminder",
    "messages_from_json",
    "messages_to_json",
    "run_planner_loop",
    "should_compact",
    "tool_result_message",
]
