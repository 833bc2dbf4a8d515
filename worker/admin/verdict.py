"""The verdict on a stored iteration: one line on what its tools did and whether the figures
in its answer came from somewhere (the last line of ``mana-ai iterations show``, and the
console's iteration page)."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from worker.admin.replay import is_summary
from worker.queries.stored import StoredIteration

__all__ = ["unsupported_figures", "verdict", "warning", "with_warnings"]

_FIGURE = re.compile(r"\d[\d:.,/+\-T]*\d")
"""A figure in an answer: two or more digits, with the separators of times, dates, decimals
(``23:45:17``, ``2026-11-29T23:45:17+00:00``, ``1,234.5``, ``42``)."""
_SHOWN_FIGURES = 3


def verdict(iteration: StoredIteration) -> str:
    """One line on what the tools did in ``iteration`` (a stored iteration as
    ``AdminStore.get_iteration`` returns it), for the end of ``iterations show``.

    It names each tool with each outcome it had, how many calls had it (``x3``) and its policy
    hint, and counts the writes that ran;
    then it checks the final answer: every figure in it (a time, a date, an id, a number of
    two or more digits) should come from a tool result, an error the model read, or the
    objective; figures from nowhere are named (the model made them up). E.g.
    ``verdict: succeeded; tools: clock_now ok (read); every figure in the answer came from a
    tool or the objective``.
    """
    status = str(iteration.get("status"))
    if status == "awaiting_approval":
        waiting = [a for a in iteration.get("approvals") or [] if a.get("status") == "pending"]
        status = "parked: waiting for a person's approval" + (
            f" of {waiting[-1].get('tool')} (`mana-ai approvals show {waiting[-1].get('id')}`)"
            if waiting
            else " (decided: the next claim goes on with it)"
        )
    elif status != "succeeded" and iteration.get("stop_reason"):
        status += f" ({iteration['stop_reason']})"
    calls = iteration.get("tool_invocations") or []
    parts = [f"verdict: {status}"]
    if not calls:
        parts.append("no tool ran")
    else:
        hints = _policy_hints()
        counted = Counter((str(c["tool"]), str(c["outcome"])) for c in calls)  # first seen first
        described = [
            f"{tool} {outcome}"
            + (f" x{n}" if n > 1 else "")
            + (f" ({hints[tool]})" if tool in hints else "")
            for (tool, outcome), n in counted.items()
        ]
        if len(described) > 6:
            described = [*described[:6], f"and {len(described) - 6} more"]
        parts.append("tools: " + ", ".join(described))
        writes = [c for c in calls if hints.get(c["tool"]) in ("write", "destructive")]
        if writes:
            ran = sum(1 for c in writes if c["outcome"] == "ok")
            parts.append(f"{ran} of {len(writes)} write(s) ran")
        else:
            parts.append("nothing was written")
    answer = _final_answer(iteration.get("messages") or [])
    if answer is None:
        parts.append("no answer")
    else:
        warned = warning(iteration)
        if warned is not None:
            parts.append(warned)
        elif _FIGURE.search(answer):
            parts.append("every figure in the answer came from a tool or the objective")
    return "; ".join(parts)


def warning(iteration: Mapping[str, Any]) -> str | None:
    """The verdict's warning on ``iteration`` (its ``messages`` and ``tool_invocations``
    suffice): ``the answer states 23:45:17, which no tool returned`` when its final answer
    states figures from nowhere (the model made them up); ``None`` when it does not, or there
    is no answer. What the lists show beside a status."""
    answer = _final_answer(iteration.get("messages") or [])
    if answer is None:
        return None
    unsupported = unsupported_figures(answer, _known_text(iteration))
    if not unsupported:
        return None
    shown = ", ".join(unsupported[:_SHOWN_FIGURES])
    more = len(unsupported) - _SHOWN_FIGURES
    figures = f"{shown} and {more} more" if more > 0 else shown
    return f"the answer states {figures}, which no tool returned"


def with_warnings(
    rows: list[dict[str, Any]], answers: Mapping[int, Mapping[str, Any]], key: str = "id"
) -> list[dict[str, Any]]:
    """``rows`` (iterations of a list, or missions with their last run: ``key`` names the
    iteration id) each with ``warning`` (``last_warning`` for ``key="last_iteration_id"``):
    ``warning`` of its answer (``answers``: ``worker.queries.reads.answers_of``) or ``None``."""
    field = "last_warning" if key == "last_iteration_id" else "warning"
    for row in rows:
        answer = answers.get(row.get(key))  # type: ignore[arg-type]
        row[field] = None if answer is None else warning(answer)
    return rows


_TIME = re.compile(r"(\d{1,2})[:.](\d{2})(?::(\d{2}))?")
_MERIDIEM = re.compile(r"\s*([ap])\.?\s?m\b\.?", re.IGNORECASE)
_ISO_DATE = re.compile(r"(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})")
_DAY_FIRST_OR_MONTH_FIRST = re.compile(r"(\d{1,2})[-/.](\d{1,2})[-/.](\d{4}|\d{2})")
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_PARTS = re.compile(r"[T+Z ]")
_DIGITS = re.compile(r"\d+")


def unsupported_figures(answer: str, known: str) -> list[str]:
    """The figures of ``answer`` (see ``_FIGURE``) that ``known`` does not hold, in order,
    each once. A figure is held when it is one of ``known``'s figures (or a part of one: the
    date or the time of a timestamp), or the same value written another way: a time on the
    12-hour clock (``5:14 pm`` for ``17:14:27``; seconds, when given, must be the same), a date
    day or month first (``12/3/2026``, ``3.12.26`` for ``2026-12-03``), a number with or
    without thousands separators (``1,234.50`` for ``1234.5``). A figure found only inside a
    longer one (``14:27`` in ``17:14:27``, ``99`` in ``1990``) is not held."""
    held = _Held(known)
    found: dict[str, None] = {}
    for match in _FIGURE.finditer(answer):
        figure = match.group(0).rstrip(".,")
        after = answer[match.start() + len(figure) :]
        if figure not in found and not held.holds(figure, after):
            found[figure] = None
    return list(found)


class _Held:
    """What a text states: its figures and their parts, and its times, dates and numbers in
    one form each (``T17:14``, ``T17:14:27``, ``D2026-12-03``, ``N1234.5``)."""

    def __init__(self, known: str) -> None:
        self.figures: set[str] = set()
        for figure in (m.group(0).rstrip(".,") for m in _FIGURE.finditer(known)):
            self.figures |= {figure, *_PARTS.split(figure), *_DIGITS.findall(figure)}
        self.forms: set[str] = set()
        for figure in self.figures:
            for form in _forms(figure, ""):  # a time with seconds states its minute too
                self.forms |= {form, form[:6]} if form.startswith("T") else {form}
            if _NUMBER.fullmatch(figure):
                self.forms.add(_number_form(figure))

    def holds(self, figure: str, after: str) -> bool:
        """Whether ``figure`` (followed by ``after`` in its text) is one of these figures or
        the same value written another way."""
        forms = _forms(figure, after)
        if forms:  # a time or a date: by value only
            return bool(forms & self.forms)
        if figure in self.figures:
            return True
        return bool(_NUMBER.fullmatch(figure)) and _number_form(figure) in self.forms


def _number_form(figure: str) -> str:
    return f"N{Decimal(figure.replace(',', '')).normalize()}"


def _forms(figure: str, after: str) -> set[str]:
    """The forms ``figure`` stands for as a time (with the ``am``/``pm`` that follows it in
    ``after``; ``H.MM`` only with one) or a date (day or month first; a two-digit year is this
    century's); empty for anything else."""
    if (time := _TIME.fullmatch(figure)) and (":" in figure or _MERIDIEM.match(after)):
        hour, minute, second = int(time.group(1)), time.group(2), time.group(3)
        meridiem = _MERIDIEM.match(after)
        if meridiem and 1 <= hour <= 12:
            hour = hour % 12 + (12 if meridiem.group(1).lower() == "p" else 0)
        if hour > 23:
            return set()
        return {f"T{hour:02d}:{minute}" + (f":{second}" if second else "")}
    if date := _ISO_DATE.fullmatch(figure):
        y, m, d = (int(x) for x in date.groups())
        return {f"D{y:04d}-{m:02d}-{d:02d}"}
    if date := _DAY_FIRST_OR_MONTH_FIRST.fullmatch(figure):
        a, b = int(date.group(1)), int(date.group(2))
        y = int(date.group(3)) + (2000 if len(date.group(3)) == 2 else 0)
        return {f"D{y:04d}-{a:02d}-{b:02d}", f"D{y:04d}-{b:02d}-{a:02d}"}
    return set()


def _final_answer(messages: list[dict[str, Any]]) -> str | None:
    last = messages[-1] if messages else None
    if last and last.get("role") == "assistant" and not last.get("tool_calls"):
        content = last.get("content")
        return content if isinstance(content, str) and content.strip() else None
    return None


def _known_text(iteration: Mapping[str, Any]) -> str:
    """What the model was told: the objective and system prompt, tool results and errors
    (every call's, folded ones included; not a compaction's summary, which a model wrote)."""
    texts = [
        str(m.get("content") or "")
        for m in iteration.get("messages") or []
        if m.get("role") in ("system", "user", "tool") and not is_summary(m)
    ]
    for call in iteration.get("tool_invocations") or []:
        texts.append(json.dumps(call.get("result"), ensure_ascii=False))
        texts.append(str(call.get("error") or ""))
    return "\n".join(texts)


def _policy_hints() -> dict[str, str]:
    from worker.tools import builtin_tool_catalog

    return {t.name: t.policy_hint for t in builtin_tool_catalog()}
