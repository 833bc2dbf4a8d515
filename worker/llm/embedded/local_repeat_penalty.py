"""llama.cpp's repeat penalty as a logits processor that leaves some tokens alone: the
embedded model must be able to copy a tool result's digits (a time, a date) into its answer.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from typing import Any

__all__ = [
    "COPYABLE_TOKEN",
    "REPEAT_WINDOW_TOKENS",
    "RepeatPenalty",
    "copyable_mask",
    "copyable_tokens",
]

REPEAT_WINDOW_TOKENS = 64
"""Tokens back that the repeat penalty looks at (llama.cpp's default ``last_n``)."""

COPYABLE_TOKEN = re.compile(r"\s*[0-9]+")
"""Tokens the repeat penalty leaves alone: digits (SmolLM2 has one token per digit). Asked for
the time, the model must write ``2026-02-22T04:21:55`` again: digits that are in the tool
result and repeat inside the time itself. With digits penalised SmolLM2-135M wrote another
time in 8 of 8 trials ("2018-03-24T17:59:56"); left alone, it copied the time in 20 of 20
runs of the quick start (``bench/quickstart.py``). Punctuation stays penalised: exempting
``:`` and ``-`` too let it loop on ``:00:00:00…`` until ``max_tokens``."""


class RepeatPenalty:
    """llama.cpp's repeat penalty as a logits processor, leaving some tokens alone.

    Each token among the last ``window`` of the context (prompt and reply so far) that is not
    ``exempt`` has its logit divided by ``penalty`` when positive, multiplied when negative.

    Args:
        penalty: above 1.0 makes repeats less likely.
        exempt: a numpy array of booleans, one per token of the vocabulary.
        window: how many tokens back to look.
    """

    def __init__(self, penalty: float, exempt: Any, window: int = REPEAT_WINDOW_TOKENS) -> None:
        self.penalty = penalty
        self.exempt = exempt
        self.window = window
        self._numpy: Any = importlib.import_module("numpy")

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """New ``scores`` (the logits, by token id) for the context ``input_ids``."""
        np = self._numpy
        recent = np.unique(np.asarray(input_ids[-self.window :], dtype=np.intp))
        recent = recent[(recent >= 0) & (recent < len(self.exempt))]
        recent = recent[~self.exempt[recent]]
        values = scores[recent]
        scores[recent] = np.where(values > 0, values / self.penalty, values * self.penalty)
        return scores


def copyable_tokens(llama: Any) -> Any:
    """A numpy array of booleans by token id: which tokens of ``llama``'s vocabulary are
    ``COPYABLE_TOKEN``s (about 0.1 s for SmolLM2's 49,152 tokens)."""
    texts = (llama.detokenize([i]).decode("utf-8", "ignore") for i in range(llama.n_vocab()))
    return copyable_mask(texts)


def copyable_mask(texts: Iterable[str]) -> Any:
    """A numpy array of booleans, one per text (a vocabulary's token texts by id): which are
    ``COPYABLE_TOKEN``s."""
    np: Any = importlib.import_module("numpy")
    return np.fromiter((COPYABLE_TOKEN.fullmatch(t) is not None for t in texts), dtype=bool)
