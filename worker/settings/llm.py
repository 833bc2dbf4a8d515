"""The LLM endpoints and how they are asked: ``LlmSettings`` (``Settings.llm``).

One ``Endpoint`` model (base URL, API key, model name) is used three times: the mission's
(``primary``: ``MANA_AI_LLM_BASE_URL``, ``_LLM_API_KEY``, ``_LLM_MODEL``), the ``fallback``
(``MANA_AI_LLM_FALLBACK_*``) and the compaction summariser's (``compaction``:
``MANA_AI_COMPACT_BASE_URL``, ``_COMPACT_API_KEY``, ``_COMPACT_MODEL``). The other fields
(timeouts, retries, schema dialect, the embedded model's runtime) apply to all of them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from worker.settings.values import (
    GIB,
    HOUR_S,
    MIB,
    ApiKey,
    CaseInsensitive,
    EndpointUrl,
    Keywords,
    ModelName,
    Section,
)

__all__ = ["ENDPOINTS", "Endpoint", "LlmSettings"]


class Endpoint(Section):
    """An OpenAI-compatible chat-completions endpoint: ``base_url`` (http(s), without its
    trailing ``/``; ``None``: none configured), ``api_key`` (sent as a Bearer token, never
    logged) and ``model`` (the model name sent to it; ``None``: the agent's or the endpoint's
    default)."""

    base_url: EndpointUrl = Field(default=None, description="Base URL of the endpoint.")
    api_key: ApiKey = Field(default=None, description="API key sent as a Bearer token.")
    model: ModelName = Field(default=None, description="Model name sent to the endpoint.")


ENDPOINTS: dict[str, tuple[str, dict[str, str]]] = {
    "primary": (
        "LLM_",
        {
            "base_url": (
                "Base URL of an OpenAI-compatible chat-completions endpoint (mana-llm, OpenAI, "
                "vLLM, Ollama, LiteLLM, Gemini), e.g. https://api.openai.com/v1. "
                "Unset: the embedded local model is used."
            ),
            "api_key": "API key sent as a Bearer token to MANA_AI_LLM_BASE_URL. Never logged.",
            "model": (
                "Default model name for agents that don't name one. Unset: the endpoint's "
                "default (or the embedded model)."
            ),
        },
    ),
    "fallback": (
        "LLM_FALLBACK_",
        {
            "base_url": (
                "Base URL of a second OpenAI-compatible endpoint. A request goes there when "
                "the primary endpoint still fails after its retries, or answers an error that "
                "retrying cannot fix (400, 401, 404, a reply that is not a chat completion or is "
                "larger than MANA_AI_LLM_MAX_RESPONSE_BYTES). Each round's assistant message "
                "records which endpoint answered. Unset: no fallback."
            ),
            "api_key": (
                "API key sent as a Bearer token to MANA_AI_LLM_FALLBACK_BASE_URL. Never logged."
            ),
            "model": (
                "Model name sent to the fallback endpoint in place of the agent's model. "
                "Unset: the agent's model (or MANA_AI_LLM_MODEL) is sent to the fallback too."
            ),
        },
    ),
    "compaction": (
        "COMPACT_",
        {
            "base_url": (
                "OpenAI-compatible endpoint of MANA_AI_COMPACT_MODEL, when it is not the "
                "mission's endpoint. Unset: MANA_AI_LLM_BASE_URL (or the embedded model)."
            ),
            "api_key": "API key sent to MANA_AI_COMPACT_BASE_URL. Never logged.",
            "model": (
                "Model that writes the summaries (e.g. a cheaper one). Unset: the mission's model."
            ),
        },
    ),
}
"""Each use of ``Endpoint`` in ``LlmSettings``: the prefix of its variables after ``MANA_AI_``
(``LLM_`` gives ``MANA_AI_LLM_BASE_URL``) and the operator documentation of each of them
(``docs/reference/settings.md`` shows it)."""


class LlmSettings(Section):
    """The three endpoints (``ENDPOINTS``) and how every chat-completion request is made."""

    primary: Endpoint = Field(
        default_factory=Endpoint,
        description="The missions' endpoint. No base URL: the embedded local model.",
    )
    fallback: Endpoint = Field(
        default_factory=Endpoint,
        description="Asked when the primary endpoint fails. No base URL: no fallback.",
    )
    compaction: Endpoint = Field(
        default_factory=Endpoint,
        description=(
            "Writes compaction summaries. No base URL: the primary endpoint (or the embedded "
            "model)."
        ),
    )
    local_runtime: Annotated[Literal["auto", "numpy", "llama-cpp"], CaseInsensitive] = Field(
        default="auto",
        description=(
            "Which runtime runs the embedded model (MANA_AI_LLM_BASE_URL unset): 'numpy' "
            "(numpy, gguf, tokenizers and llguidance, prebuilt wheels: the [local] extra), "
            "'llama-cpp' (llama-cpp-python, compiled on install: the [llama-cpp] extra), or "
            "'auto' (default): llama-cpp when llama-cpp-python is installed, else numpy. Both "
            "run the same GGUF file with the same prompt, reply grammar and repeat penalty; a "
            "runtime whose packages are missing fails the first request with the command that "
            "installs them."
        ),
    )
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=HOUR_S,
        description=(
            "Seconds (at most 3600) one chat-completion attempt may take in total, from "
            "connecting to the last byte of the answer, before it counts as failed (a timeout, "
            "retried). A body that trickles in counts against the same deadline."
        ),
    )
    max_retries: int = Field(
        default=3,
        ge=0,
        le=100,
        description=(
            "Retries of a failed chat-completion request (connection errors, timeouts, 429 "
            "and 5xx answers), with exponential backoff (0-100). 0 disables retries."
        ),
    )
    max_response_bytes: int = Field(
        default=8 * MIB,
        ge=1024,
        le=GIB,
        description=(
            "Bytes of a chat-completion answer read at most (after gzip decoding; 1024 to "
            "1073741824, default 8 MiB), from every endpoint: the mission's, the fallback and "
            "the compaction summariser. A larger answer is stopped there and fails at once, "
            "not retried (the fallback endpoint is asked, when set). Of an error answer "
            "(4xx, 5xx) at most the first 64 KiB are read, for the error's text."
        ),
    )
    schema_dialect: Annotated[Literal["json-schema", "gemini"], CaseInsensitive] = Field(
        default="json-schema",
        description=(
            "How tool parameter schemas are sent: 'json-schema' sends them as written (JSON "
            "Schema 2020-12); 'gemini' keeps only the keywords of Gemini's function-declaration "
            "Schema (type, description, properties, required, enum, items, anyOf, format, "
            "nullable, minimum/maximum, minLength/maxLength, pattern, default, ...) and drops "
            "others such as additionalProperties and $schema. Arguments are always checked "
            "against the full schema."
        ),
    )
    schema_strip: Keywords = Field(
        default=(),
        description=(
            "Comma-separated JSON Schema keywords to leave out of the tool schemas sent to the "
            "endpoints, e.g. 'additionalProperties,default' for an endpoint that answers 400 "
            "to them (applies on top of MANA_AI_LLM_SCHEMA_DIALECT). Default: none."
        ),
    )
