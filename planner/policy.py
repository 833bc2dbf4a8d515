"""The policy gate's rules: ``evaluate_policy()`` decides whether one tool call may run.

``evaluate_policy(PolicyInput) -> PolicyDecision`` is a pure function: no I/O, no clock (the
input carries ``now``). The rules, in the order they are checked:

1. **scope exposure** — a consumer (the mission runner, the MCP server) passes the scopes it
   exposes; a tool outside them is denied (``scope_not_exposed``).
2. **destructive opt-in** — a ``destructive`` tool is denied unless the user opted in to that
   tool or to its scope (``destructive_not_opted_in``).
3. **rate limit per user per tool** — at most ``RateLimit.calls`` calls in a rolling
   ``RateLimit.window`` (default 30 per 60 s); the input carries the timestamps of the user's
   recent calls of the tool that took a slot (``rate_limited``). Overrides: per user and tool,
   per user, per tool (operator), then the default.
4. **injection markers** — every string of the arguments, at any depth (keys included), is
   scanned for prompt-injection markers (``{{``, ``<system``, ``ignore previous`` and a
   configurable list). A match never blocks: it sets the ``injection_marker`` flag, and the
   matched markers are listed on the decision. Matching is robust to case, runs of whitespace,
   zero-width and other format characters, combining marks, Unicode compatibility forms (NFKC:
   full-width letters and brackets) and a few bracket look-alikes.

The scan is bounded (``PolicyConfig.max_inspected_chars`` characters and ``max_inspected_nodes``
values per call): arguments of 10 MB or 10,000 levels deep get a decision in bounded time, with
the ``inspection_truncated`` flag saying that not everything was read.

Modes: ``off`` (no rules run, every call allowed), ``log-only`` (rules run and the decision is
recorded, but the call always runs: a denial is a *would-be* denial) and ``enforce`` (a denied
call does not run). ``PolicyDecision.verdict`` is what the rules decided, ``allow`` what the
loop does.

The seam the loop awaits is ``PolicyGate = async (spec, call, ctx) -> PolicyDecision``;
``RulePolicyGate`` is the gate every consumer uses: it applies ``evaluate_policy`` and takes
rate-limit slots from a ``CallLedger`` (PostgreSQL in the worker, in memory in
``planner.testing``), so that counting and reserving a slot are one atomic step.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict

from planner.errors import RunInterrupted
from planner.messages import ToolCall
from planner.tools import ToolContext, ToolSpec

__all__ = [
    "ALLOWED",
    "ARGUMENTS_NOT_OBJECT",
    "DEFAULT_INJECTION_MARKERS",
    "DEFAULT_RATE_LIMIT",
    "DENY_REASONS",
    "DESTRUCTIVE_NOT_OPTED_IN",
    "INJECTION_MARKER",
    "INSPECTION_TRUNCATED",
    "POLICY_MODES",
    "POLICY_OFF",
    "POLICY_UNAVAILABLE",
    "RATE_LIMITED",
    "SCOPE_NOT_EXPOSED",
    "CallLedger",
    "DecisionObserver",
    "PolicyConfig",
    "PolicyDecision",
    "PolicyGate",
    "PolicyInput",
    "PolicyMode",
    "RateLimit",
    "Reservation",
    "RulePolicyGate",
    "UserPolicySettings",
    "evaluate_policy",
    "find_injection_markers",
    "normalize_for_markers",
]

logger = logging.getLogger(__name__)

PolicyMode = Literal["off", "log-only", "enforce"]
POLICY_MODES: tuple[PolicyMode, ...] = ("off", "log-only", "enforce")

# Reason codes (machine-readable; stored on every decision and used as a metric label).
ALLOWED = "allowed"
POLICY_OFF = "policy_off"
SCOPE_NOT_EXPOSED = "scope_not_exposed"
DESTRUCTIVE_NOT_OPTED_IN = "destructive_not_opted_in"
RATE_LIMITED = "rate_limited"
POLICY_UNAVAILABLE = "policy_unavailable"
DENY_REASONS = (SCOPE_NOT_EXPOSED, DESTRUCTIVE_NOT_OPTED_IN, RATE_LIMITED, POLICY_UNAVAILABLE)

# Flags: what the gate noticed without blocking.
INJECTION_MARKER = "injection_marker"
INSPECTION_TRUNCATED = "inspection_truncated"
ARGUMENTS_NOT_OBJECT = "arguments_not_object"

DEFAULT_INJECTION_MARKERS: tuple[str, ...] = (
    "{{",
    "<system",
    "ignore previous",
    "ignore all previous",
)
"""The seed design's markers (template injection, fake system tags, the classic override) and
the override's most common wording."""

MAX_INSPECTED_CHARS = 65_536
"""Characters of a call's strings scanned for markers (all strings together); the rest is not
read and the decision carries ``inspection_truncated``."""

MAX_INSPECTED_NODES = 10_000
"""Values (strings, numbers, containers) of a call's arguments visited at most."""

MAX_RATE_LIMIT_CALLS = 100_000
"""Largest accepted ``RateLimit.calls``: the ledger keeps one timestamp per slot taken."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``calls`` calls per rolling ``window``.

    Raises:
        ValueError: ``calls`` outside 1..100,000 or a window that is not positive.
    """

    calls: int
    window: timedelta

    def __post_init__(self) -> None:
        if not 1 <= self.calls <= MAX_RATE_LIMIT_CALLS:
            raise ValueError(
                f"rate limit calls must be 1..{MAX_RATE_LIMIT_CALLS}, got {self.calls}"
            )
        if self.window <= timedelta(0):
            raise ValueError(f"rate limit window must be positive, got {self.window}")

    def describe(self) -> str:
        """E.g. ``30 calls per 60 s``."""
        return f"{self.calls} calls per {self.window.total_seconds():g} s"


DEFAULT_RATE_LIMIT = RateLimit(calls=30, window=timedelta(seconds=60))
"""30 calls per rolling 60 s, per user and tool (the seed design's default)."""


@dataclass(frozen=True, slots=True)
class UserPolicySettings:
    """One user's policy settings (table ``user_policy_settings``).

    Attributes:
        destructive_opt_ins: tool names or scopes whose destructive tools the user allows.
        rate_limit: calls per window for every tool of this user (``None``: the operator's).
        tool_rate_limits: calls per window for one tool of this user (wins over the above).
    """

    destructive_opt_ins: frozenset[str] = frozenset()
    rate_limit: int | None = None
    tool_rate_limits: Mapping[str, int] = field(default_factory=dict)

    def opted_in(self, spec: ToolSpec) -> bool:
        """True when the user opted in to ``spec`` by its name or its scope."""
        return spec.name in self.destructive_opt_ins or spec.scope in self.destructive_opt_ins


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """What a consumer configures once (from the operator's settings).

    Attributes:
        rate_limit: the default rate limit per user and tool (30 per 60 s).
        tool_rate_limits: operator overrides of the call count per tool name.
        injection_markers: markers to flag (matched after normalisation, see the module doc).
        exposed_scopes: the scopes this consumer exposes; ``None`` exposes every scope.
        max_inspected_chars, max_inspected_nodes: bounds of the marker scan per call.
    """

    rate_limit: RateLimit = DEFAULT_RATE_LIMIT
    tool_rate_limits: Mapping[str, int] = field(default_factory=dict)
    injection_markers: tuple[str, ...] = DEFAULT_INJECTION_MARKERS
    exposed_scopes: frozenset[str] | None = None
    max_inspected_chars: int = MAX_INSPECTED_CHARS
    max_inspected_nodes: int = MAX_INSPECTED_NODES

    def rate_limit_for(self, tool: str, user: UserPolicySettings) -> RateLimit:
        """The limit that applies to ``user`` calling ``tool``; the most specific setting
        wins: the user's limit for this tool, else the operator's limit for this tool, else the
        user's limit for every tool, else the default."""
        calls, _ = self.rate_limit_source(tool, user)
        if calls == self.rate_limit.calls:
            return self.rate_limit
        return RateLimit(calls=calls, window=self.rate_limit.window)

    def rate_limit_source(self, tool: str, user: UserPolicySettings) -> tuple[int, str]:
        """``(calls, where from)`` of ``rate_limit_for``: ``user+tool``, ``tool``, ``user``
        or ``default``."""
        for calls, source in (
            (user.tool_rate_limits.get(tool), "user+tool"),
            (self.tool_rate_limits.get(tool), "tool"),
            (user.rate_limit, "user"),
        ):
            if calls is not None:
                return calls, source
        return self.rate_limit.calls, "default"


class PolicyDecision(BaseModel):
    """Whether one tool call may run: a value the loop acts on.

    Attributes:
        allow: what the loop does: run the call (``True``) or answer it with an error tool
            result and never run its handler (``False``). Always ``True`` in ``log-only``.
        reason: a machine-readable code: ``allowed``, ``policy_off``, ``scope_not_exposed``,
            ``destructive_not_opted_in``, ``rate_limited`` or ``policy_unavailable``.
        verdict: what the rules decided (``allow`` | ``deny``), whatever the mode: in
            ``log-only`` a ``deny`` verdict with ``allow=True`` is a would-be denial.
        mode: the mode the decision was taken in (``None`` for a hand-made decision).
        message: why, in words, for the model (on a denial) and the operator.
        reminder: a hint for the model's next request (reminder channel), on a denial.
        flags: what the gate noticed without blocking (``injection_marker``,
            ``inspection_truncated``, ``arguments_not_object``).
        markers: the injection markers found, as configured.
    """

    model_config = ConfigDict(frozen=True)

    allow: bool
    reason: str | None = None
    reminder: str | None = None
    flags: tuple[str, ...] = ()
    verdict: Literal["allow", "deny"] | None = None
    mode: PolicyMode | None = None
    message: str | None = None
    markers: tuple[str, ...] = ()

    @property
    def denied_by_rules(self) -> bool:
        """True when the rules said deny (enforced or not); hand-made decisions: ``not allow``."""
        return self.verdict == "deny" if self.verdict is not None else not self.allow


PolicyGate = Callable[[ToolSpec, ToolCall, ToolContext], Awaitable[PolicyDecision]]
"""``async (spec, call, ctx) -> PolicyDecision``, awaited before a known tool's handler runs."""


class PolicyInput(NamedTuple):
    """Everything ``evaluate_policy`` looks at (an immutable record; change it with
    ``_replace``).

    Attributes:
        spec: the tool called.
        ctx: who calls it (``ctx.user_id`` is the user the limits and opt-ins belong to).
        raw_input: the call's arguments as received (normally a dict; anything is accepted).
        user_settings: the user's opt-ins and rate-limit overrides.
        recent_invocations: timestamps (UTC-aware) of the user's recent calls of this tool
            that took a rate-limit slot; ``None`` when they were not counted (the rate rule is
            then skipped: the caller counts and reserves separately).
        mode: ``off`` | ``log-only`` | ``enforce``.
        now: the time the rate limit is judged at (UTC-aware); the rate rule needs it with
            ``recent_invocations`` and is skipped without it.
        config: the consumer's configuration.
    """

    spec: ToolSpec
    ctx: ToolContext
    raw_input: Any
    user_settings: UserPolicySettings
    recent_invocations: Sequence[datetime] | None
    mode: PolicyMode
    now: datetime | None = None
    config: PolicyConfig = PolicyConfig()


def evaluate_policy(inp: PolicyInput) -> PolicyDecision:
    """Decide one call (see the module docstring for the rules and their order).

    Pure and total: never raises for any ``raw_input`` (not an object, huge, deeply nested,
    lone surrogates); the time it takes is bounded by the config's scan limits.
    """
    if inp.mode == "off":
        return _OFF_DECISION
    markers, truncated, not_object = find_injection_markers(
        inp.raw_input,
        inp.config.injection_markers,
        max_chars=inp.config.max_inspected_chars,
        max_nodes=inp.config.max_inspected_nodes,
    )
    flags: tuple[str, ...] = ()
    if markers or truncated or not_object:
        flags = tuple(
            flag
            for flag, on in (
                (INJECTION_MARKER, bool(markers)),
                (INSPECTION_TRUNCATED, truncated),
                (ARGUMENTS_NOT_OBJECT, not_object),
            )
            if on
        )
    denial = _first_denial(inp)
    if denial is None:
        if not flags and inp.mode == "enforce":
            return _ALLOWED_ENFORCE
        if not flags:
            return _ALLOWED_LOG_ONLY
        return PolicyDecision(
            allow=True, reason=ALLOWED, verdict="allow", mode=inp.mode, flags=flags, markers=markers
        )
    reason, message, reminder = denial
    return PolicyDecision(
        allow=inp.mode != "enforce",
        reason=reason,
        verdict="deny",
        mode=inp.mode,
        message=message,
        reminder=reminder if inp.mode == "enforce" else None,
        flags=flags,
        markers=markers,
    )


_OFF_DECISION = PolicyDecision(allow=True, reason=POLICY_OFF, verdict="allow", mode="off")
_ALLOWED_ENFORCE = PolicyDecision(allow=True, reason=ALLOWED, verdict="allow", mode="enforce")
_ALLOWED_LOG_ONLY = PolicyDecision(allow=True, reason=ALLOWED, verdict="allow", mode="log-only")


def _first_denial(inp: PolicyInput) -> tuple[str, str, str] | None:
    """(reason, message, reminder) of the first rule that denies, or ``None``."""
    spec, config = inp.spec, inp.config
    if config.exposed_scopes is not None and spec.scope not in config.exposed_scopes:
        exposed = ", ".join(sorted(config.exposed_scopes)) or "(none)"
        return (
            SCOPE_NOT_EXPOSED,
            f"{spec.name} is in scope {spec.scope!r}, which is not exposed here "
            f"(exposed scopes: {exposed})",
            f"{spec.name} is not available here; do not call it again.",
        )
    if spec.policy_hint == "destructive" and not inp.user_settings.opted_in(spec):
        return (
            DESTRUCTIVE_NOT_OPTED_IN,
            f"{spec.name} is destructive and user {inp.ctx.user_id!r} has not opted in to it "
            f"(nor to its scope {spec.scope!r})",
            f"{spec.name} needs the user's opt-in; do not retry it. Go on without it, or say "
            "in your answer what you would have done.",
        )
    if inp.recent_invocations is not None and inp.now is not None:
        limit = config.rate_limit_for(spec.name, inp.user_settings)
        wait = rate_limit_wait(inp.recent_invocations, limit, inp.now)
        if wait is not None:
            return (
                RATE_LIMITED,
                f"rate limit reached: user {inp.ctx.user_id!r} may call {spec.name} "
                f"{limit.describe()}; the next slot frees in {_ceil_s(wait)} s",
                f"{spec.name} is rate-limited ({limit.describe()}); do not call it again "
                "right away: work with what you have.",
            )
    return None


def rate_limit_wait(
    recent: Sequence[datetime], limit: RateLimit, now: datetime
) -> timedelta | None:
    """How long until a slot frees, or ``None`` when a call may take one now.

    A call may run when fewer than ``limit.calls`` of ``recent`` lie in the rolling window
    ``(now - limit.window, now]``. The PostgreSQL ledger applies the same predicate when it
    reserves (``worker/store/user_policy.py``), so the two always agree.
    """
    start = now - limit.window
    in_window = sorted((t for t in recent if t > start), reverse=True)
    if len(in_window) < limit.calls:
        return None
    return in_window[limit.calls - 1] + limit.window - now


def _ceil_s(delta: timedelta) -> int:
    seconds = delta.total_seconds()
    return max(1, int(seconds) + (0 if seconds == int(seconds) else 1))


# -- injection markers ----------------------------------------------------------------------

# Look-alikes that NFKC leaves alone but a reader (or a model) takes for the ASCII character.
_LOOKALIKES = str.maketrans(
    {
        "\u2039": "<",  # single left-pointing angle quotation mark
        "\u2329": "<",  # left-pointing angle bracket
        "\u27e8": "<",  # mathematical left angle bracket
        "\u3008": "<",  # CJK left angle bracket
        "\u276e": "<",  # heavy left-pointing angle quotation mark ornament
        "\u02c2": "<",  # modifier letter left arrowhead
        "\u2774": "{",  # medium left curly bracket ornament
        "\u2983": "{",  # left white curly bracket
        # Cyrillic and Greek letters that look like Latin ones.
        "\u0430": "a",
        "\u0435": "e",
        "\u043e": "o",
        "\u0440": "p",
        "\u0441": "c",
        "\u0443": "y",
        "\u0445": "x",
        "\u0456": "i",
        "\u0455": "s",
        "\u0458": "j",
        "\u04bb": "h",
        "\u0501": "d",
        "\u03bf": "o",
        "\u03b9": "i",
        "\u03bd": "v",
        "\u03c1": "p",
        "\u0442": "t",
        "\u043c": "m",
        "\u0433": "r",
        "\u0131": "i",  # dotless i
        # small capitals
        "\u1d00": "a",
        "\u0299": "b",
        "\u1d04": "c",
        "\u1d05": "d",
        "\u1d07": "e",
        "\ua730": "f",
        "\u0262": "g",
        "\u029c": "h",
        "\u026a": "i",
        "\u1d0a": "j",
        "\u1d0b": "k",
        "\u029f": "l",
        "\u1d0d": "m",
        "\u0274": "n",
        "\u1d0f": "o",
        "\u1d18": "p",
        "\u0280": "r",
        "\ua731": "s",
        "\u1d1b": "t",
        "\u1d1c": "u",
        "\u1d20": "v",
        "\u1d21": "w",
        "\u028f": "y",
        "\u1d22": "z",
    }
)


def normalize_for_markers(text: str, format_as_space: bool = False) -> str:
    """``text`` in the form markers are matched in: compatibility-decomposed (NFKD), without
    format characters (zero-width spaces and joiners, soft hyphens, bidi controls: category
    ``Cf``; with ``format_as_space`` they become spaces instead, for text that uses them as
    word breaks), control characters other than whitespace and combining marks, recomposed
    (NFKC), case-folded, look-alike brackets and letters (Cyrillic, Greek, small capitals,
    dotless i) mapped to ASCII, and every run of whitespace turned into one space."""
    if text.isascii() and _CONTROL.search(text) is None:
        return " ".join(text.lower().split())
    decomposed = unicodedata.normalize("NFKD", text)
    kept = "".join(_keep(ch, format_as_space) for ch in decomposed)
    folded = unicodedata.normalize("NFKC", kept).casefold().translate(_LOOKALIKES)
    return " ".join(folded.split())


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""ASCII control characters other than whitespace: dropped before matching."""


def _keep(ch: str, format_as_space: bool) -> str:
    category = unicodedata.category(ch)
    if category == "Cf":
        return " " if format_as_space else ""
    if category in ("Mn", "Me", "Cs") or (category == "Cc" and not ch.isspace()):
        return ""
    return ch


@lru_cache(maxsize=64)
def _normalized_markers(markers: tuple[str, ...]) -> tuple[tuple[str, str, str], ...]:
    """``(marker, normalized, first word)`` of each marker that normalizes to something."""
    pairs = ((m, normalize_for_markers(m)) for m in markers)
    return tuple((m, n, n.split(" ", 1)[0]) for m, n in pairs if n)


def _matches(texts: list[str], wanted: tuple[tuple[str, str, str], ...]) -> tuple[str, ...]:
    """The markers of ``wanted`` that one of ``texts`` holds once normalized, in ``wanted``
    order. The texts are joined with a separator no marker can match across.

    Plain ASCII text (the common case) is not normalized as a whole: lower-casing is enough for
    a marker without spaces (collapsing whitespace cannot create or split a run without
    whitespace), and a marker with spaces is only looked for after its first word was found.
    """
    plain = True
    for text in texts:
        if not text.isascii() or _CONTROL.search(text) is not None:
            plain = False
            break
    if plain:
        low = texts[0].lower() if len(texts) == 1 else "\x00".join(texts).lower()
        collapsed: str | None = None
        found: list[str] = []
        for original, normalized, first in wanted:
            if first not in low:
                continue
            if first != normalized:
                if collapsed is None:
                    collapsed = " ".join(low.split())
                if normalized not in collapsed:
                    continue
            found.append(original)
        return tuple(found)
    joined = "\uffff".join(texts)  # a noncharacter: kept by the normalization, in no marker
    forms = (normalize_for_markers(joined), normalize_for_markers(joined, format_as_space=True))
    return tuple(
        original for original, normalized, _ in wanted if any(normalized in f for f in forms)
    )


_SCALARS = (int, float, bool, type(None))


def _flat_texts(value: dict[Any, Any], max_chars: int) -> list[str] | None:
    """The keys and string values of an object without nested containers whose text fits
    ``max_chars``; ``None`` when it is not that simple (the full scan handles it)."""
    texts: list[str] = []
    size = 0
    for key, inner in value.items():
        if type(key) is not str:
            return None
        texts.append(key)
        size += len(key)
        kind = type(inner)
        if kind is str:
            texts.append(inner)
            size += len(inner)
        elif kind not in _SCALARS:
            return None
    return texts if size <= max_chars else None


def find_injection_markers(
    value: Any,
    markers: Iterable[str] = DEFAULT_INJECTION_MARKERS,
    *,
    max_chars: int = MAX_INSPECTED_CHARS,
    max_nodes: int = MAX_INSPECTED_NODES,
) -> tuple[tuple[str, ...], bool, bool]:
    """Scan every string in ``value`` (dict keys and values, list items, at any depth).

    Returns:
        ``(found, truncated, not_object)``: the markers found (as given, in ``markers`` order),
        whether the scan stopped early (more than ``max_chars`` characters or ``max_nodes``
        values), and whether ``value`` is not a dict (tool arguments should be an object).

    Never raises; iterative (no recursion), so nesting depth costs nothing extra.
    """
    wanted = _normalized_markers(markers if isinstance(markers, tuple) else tuple(markers))
    if type(value) is dict and len(value) < max_nodes:
        texts = _flat_texts(value, max_chars)
        if texts is not None:  # the common case: an object of short strings and numbers
            return (_matches(texts, wanted) if texts else ()), False, False
    not_object = not isinstance(value, dict)
    texts = []
    budget = max_chars
    nodes = 0
    truncated = False
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            truncated = True
            break
        if isinstance(item, str):
            if len(item) >= budget:
                truncated = truncated or len(item) > budget
                texts.append(item[:budget])
                budget = 0
                if stack:
                    truncated = True
                break
            budget -= len(item)
            texts.append(item)
        elif isinstance(item, dict):
            for key, inner in item.items():
                stack.append(inner)
                stack.append(key)
        elif isinstance(item, list | tuple):
            stack.extend(item)
    if not texts:
        return (), truncated, not_object
    return _matches(texts, wanted), truncated, not_object


# -- the gate --------------------------------------------------------------------------------


class Reservation(NamedTuple):
    """What a ``CallLedger`` answered (an immutable record).

    Attributes:
        reserved: a slot was taken (fewer than ``limit.calls`` calls were in the window).
        now: the ledger's clock when it counted (UTC-aware); the slot is stamped with it.
        recent: when refused, the timestamps in the window (at most ``limit.calls``, in any
            order), from which the rules tell when a slot frees; may be empty when reserved.
    """

    reserved: bool
    now: datetime
    recent: tuple[datetime, ...]


class CallLedger(Protocol):
    """Counts and reserves rate-limit slots, atomically across every process sharing it."""

    async def reserve(
        self, *, user_id: str, tool: str, limit: RateLimit, consumer: str
    ) -> Reservation:
        """Count ``user_id``'s calls of ``tool`` in ``(now - limit.window, now]`` and, when
        there are fewer than ``limit.calls``, record one at ``now`` — as one atomic step, so
        two callers can never both take the last slot.

        Raises:
            Exception: the ledger is unavailable (the gate then fails closed in ``enforce``
                and open in ``log-only``).
        """
        ...


DecisionObserver = Callable[[ToolSpec, ToolCall, ToolContext, PolicyDecision], None]
"""Called with every decision a gate takes (metrics, logs). Must not raise."""


class RulePolicyGate:
    """The ``PolicyGate`` every consumer uses: ``evaluate_policy`` plus a ``CallLedger``.

    Build one per iteration (or per request): the user's settings are read once, by the
    caller. For each call it evaluates the rules that need no counting; when they allow the
    call (whatever the mode), it reserves a rate-limit slot in the ledger, and a call the
    ledger refuses is decided again with the ledger's timestamps (``rate_limited``). Calls the
    rules deny never take a slot — in ``log-only`` either, so that log-only records exactly
    what ``enforce`` would do.

    When the ledger fails, the gate fails closed in ``enforce`` (denied,
    ``policy_unavailable``) and open in ``log-only`` (allowed, with a ``policy_unavailable``
    would-be denial), and logs a warning. A ledger that raises ``RunInterrupted`` (a mission's
    ledger, once its database stayed unreachable) stops the run in ``enforce`` instead: the
    model is never told to try again for a fault that is not its own. Nothing else raises out
    of the gate.

    Args:
        mode: ``log-only`` or ``enforce`` (use no gate at all for ``off``).
        config: the consumer's configuration.
        user_settings: the settings of the user the calls run for.
        ledger: where rate-limit slots are counted and taken.
        consumer: who calls (``mission``, ``mcp``), recorded with each slot.
        observe: called with every decision (metrics, logs).
    """

    def __init__(
        self,
        *,
        mode: PolicyMode,
        config: PolicyConfig,
        user_settings: UserPolicySettings,
        ledger: CallLedger,
        consumer: str = "mission",
        observe: DecisionObserver | None = None,
    ) -> None:
        self.mode: PolicyMode = mode
        self.config = config
        self.user_settings = user_settings
        self.ledger = ledger
        self.consumer = consumer
        self.observe = observe

    async def __call__(self, spec: ToolSpec, call: ToolCall, ctx: ToolContext) -> PolicyDecision:
        """Decide ``call`` (see the class docstring); never raises except on cancellation and
        ``RunInterrupted`` from the ledger in ``enforce``."""
        inp, decision = self.rules(spec, call, ctx)
        if decision.verdict == "allow" and self.mode != "off":
            # The rules that need no counting allow the call: take a rate-limit slot.
            try:
                reservation = await self.ledger.reserve(
                    user_id=ctx.user_id,
                    tool=spec.name,
                    limit=self.config.rate_limit_for(spec.name, self.user_settings),
                    consumer=self.consumer,
                )
            except RunInterrupted:
                if self.mode == "enforce":
                    raise  # the run stops and resumes; the model is not told "try later"
                decision = self._unavailable(inp, decision, "its rate-limit store is unreachable")
                logger.warning("policy gate unavailable for %s: allowing it (log-only)", spec.name)
            except Exception as exc:
                logger.warning(
                    "policy gate unavailable for %s (%s: %s): %s",
                    spec.name,
                    type(exc).__name__,
                    exc,
                    "denying the call (enforce)"
                    if self.mode == "enforce"
                    else "allowing it (log-only)",
                )
                # the model reads the message, not the exception (which may quote SQL or
                # addresses); the log above has the details
                decision = self._unavailable(inp, decision, "its rate-limit store did not answer")
            else:
                if not reservation.reserved:
                    decision = self._refused(inp, decision, reservation)
        if self.observe is not None:
            self.report(spec, call, ctx, decision)
        return decision

    def rules(
        self, spec: ToolSpec, call: ToolCall, ctx: ToolContext
    ) -> tuple[PolicyInput, PolicyDecision]:
        """The input and the decision of the rules that need no counting (a bug in the rules
        gives a ``policy_unavailable`` decision, never an exception). A caller that counts the
        call elsewhere (in the same round trip as another write) goes on with ``limit_for``,
        ``counted`` and ``report``."""
        inp = PolicyInput(
            spec, ctx, call.arguments, self.user_settings, None, self.mode, None, self.config
        )
        try:
            return inp, evaluate_policy(inp)
        except Exception:  # a bug in the rules must not crash the loop
            logger.exception("policy rules failed for %s", spec.name)
            return inp, self._unavailable(inp, None, "its rules failed")

    def limit_for(self, spec: ToolSpec) -> RateLimit:
        """The rate limit that applies to ``spec`` for this gate's user."""
        return self.config.rate_limit_for(spec.name, self.user_settings)

    def counted(
        self, inp: PolicyInput, decision: PolicyDecision, reservation: Reservation
    ) -> PolicyDecision:
        """``decision`` (the rules' allow) once the ledger answered: unchanged when a slot
        was taken, else what the rules say given the ledger's timestamps (``rate_limited``)."""
        if reservation.reserved:
            return decision
        return self._refused(inp, decision, reservation)

    def report(
        self, spec: ToolSpec, call: ToolCall, ctx: ToolContext, decision: PolicyDecision
    ) -> None:
        """Give ``decision`` to the observer (metrics, logs); what it raises is logged."""
        if self.observe is not None:
            try:
                self.observe(spec, call, ctx, decision)
            except Exception:  # an observer must not change the decision
                logger.exception("policy decision observer failed")

    def _refused(
        self, inp: PolicyInput, allowed: PolicyDecision, reservation: Reservation
    ) -> PolicyDecision:
        """The ledger refused a slot: the rules, given its timestamps, say why."""
        counted = evaluate_policy(
            inp._replace(recent_invocations=reservation.recent, now=reservation.now)
        )
        if counted.verdict == "deny":
            return counted
        # The ledger refused, so the window is full; the rules must agree.
        logger.error("ledger refused %s but the rules allow it; denying", inp.spec.name)
        return self._unavailable(inp, allowed, "the rate-limit ledger and the rules disagree")

    def _unavailable(
        self, inp: PolicyInput, first: PolicyDecision | None, detail: str
    ) -> PolicyDecision:
        return PolicyDecision(
            allow=self.mode != "enforce",
            reason=POLICY_UNAVAILABLE,
            verdict="deny",
            mode=self.mode,
            message=f"the policy gate could not decide this call ({detail})",
            reminder=(
                f"{inp.spec.name} could not be checked by the policy gate just now; try "
                "again later or go on without it."
                if self.mode == "enforce"
                else None
            ),
            flags=first.flags if first is not None else (),
            markers=first.markers if first is not None else (),
        )
