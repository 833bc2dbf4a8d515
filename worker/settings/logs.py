"""Log output: ``LogSettings`` (``Settings.logs``): ``MANA_AI_LOG_LEVEL`` and
``MANA_AI_LOG_FORMAT``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from worker.settings.values import CaseInsensitive, LogLevel, Section

__all__ = ["LogSettings"]


class LogSettings(Section):
    """The log level and line format."""

    level: LogLevel = Field(
        default="INFO",
        description="Log level: DEBUG, INFO, WARNING, ERROR or CRITICAL (case-insensitive).",
    )
    format: Annotated[Literal["json", "text"], CaseInsensitive] = Field(
        default="text",
        description=(
            "Log line format: 'text' for humans, 'json' (one object per line) for collectors."
        ),
    )
