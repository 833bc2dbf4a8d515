"""The version of the installed package, as ``mana-ai --version`` and the MCP server say it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["package_version"]


def package_version() -> str:
    """The installed ``mana-ai`` distribution's version; ``"unknown"`` when running from a
    source tree that is not installed."""
    try:
        return version("mana-ai")
    except PackageNotFoundError:
        return "unknown"
