"""mana-ai's loop against LangGraph's, in the same sitting: CPU microseconds per round with an
instant async model and async no-op tools, and their ratio.

Not a test: it prints figures. Usage::

    python bench/peers.py [--tools 1 5] [--sittings 3] [--peers-venv .venv-peers]

LangGraph runs in a virtual environment of its own (``--peers-venv``, made and filled from
PyPI on first use: ``langgraph`` and ``langchain-core`` at ``PEER_REQUIREMENTS``), by
``bench/peers_langgraph.py``: the canonical tool-calling graph (a model node, ``ToolNode``,
``tools_condition``), the model an async ``BaseChatModel`` replaying a script, the tools async
``StructuredTool``s. mana-ai runs ``bench/loop_overhead.py``'s loop with everything on (the
policy gate in ``enforce`` over the in-memory ledger, the mission's reminder channel with
every producer, the compaction check) and bare. Both replay the same script: 5 rounds, every
round but the last calling ``--tools`` no-op tools with other arguments, then an answer.

Each sitting measures LangGraph, then mana-ai, at each tool count (LangGraph the best of 5
runs of 200 loops, mana-ai the best of 5 runs of 2000), so that the ratio is of figures taken
minutes apart on the same machine. The figures printed per tool count: each side's range
over the sittings, and the ratio mana-ai / LangGraph per sitting (everything on, and bare).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import at_least
from bench.loop_overhead import EVERYTHING, measure

ROOT = Path(__file__).resolve().parent.parent

PEER_REQUIREMENTS = ("langgraph>=1.2,<2", "langchain-core>=1.8,<2")
"""What the peers' environment holds (LangGraph 1.x; its async API as documented)."""


def peers_python(venv: Path) -> Path:
    """The peers' interpreter, the environment made and filled first when it is missing."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(
            f"making the peers' environment in {venv} (pip install {' '.join(PEER_REQUIREMENTS)})"
        )
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_REQUIREMENTS], check=True)
    return python


def langgraph(python: Path, tools: int) -> dict[str, object]:
    """One LangGraph measurement (``bench/peers_langgraph.py``), in its environment."""
    done = subprocess.run(
        [str(python), str(ROOT / "bench" / "peers_langgraph.py"), "--tools", str(tools)],
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--tools", type=at_least(1), nargs="+", default=[1, 5])
    parser.add_argument("--sittings", type=at_least(1), default=3)
    parser.add_argument("--peers-venv", type=Path, default=ROOT / ".venv-peers")
    args = parser.parse_args()
    python = peers_python(args.peers_venv)
    rows: dict[int, list[tuple[float, float, float]]] = {k: [] for k in args.tools}
    versions: object = None
    for sitting in range(args.sittings):
        for k in args.tools:
            peer = langgraph(python, k)
            versions = peer["versions"]
            ours = asyncio.run(measure(5, k, 2000, 5))
            theirs = float(peer["us_per_round"])  # type: ignore[arg-type]
            rows[k].append((theirs, ours[EVERYTHING], ours["bare loop"]))
            print(
                f"sitting {sitting + 1}, {k} tool call(s) per round: LangGraph {theirs:7.0f} us; "
                f"mana-ai everything on {ours[EVERYTHING]:6.1f} us "
                f"({ours[EVERYTHING] / theirs:.3f}x), bare {ours['bare loop']:6.1f} us "
                f"({ours['bare loop'] / theirs:.3f}x)",
                flush=True,
            )
    print(f"peers: {versions}")
    for k, figures in rows.items():
        theirs = [t for t, _, _ in figures]
        everything = [e for _, e, _ in figures]
        bare = [b for _, _, b in figures]
        on = [e / t for t, e, _ in figures]
        off = [b / t for t, _, b in figures]
        print(
            f"{k} tool call(s) per round: LangGraph {min(theirs):.0f}-{max(theirs):.0f} us, "
            f"mana-ai everything on {min(everything):.1f}-{max(everything):.1f} us, bare "
            f"{min(bare):.1f}-{max(bare):.1f} us per round (CPU); ratio everything on "
            f"{min(on):.3f}-{max(on):.3f}x, bare {min(off):.3f}-{max(off):.3f}x"
        )


if __name__ == "__main__":
    main()
