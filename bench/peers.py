"""mana-ai's loop against LangGraph's, in the same sitting: CPU microseconds per round with an
instant async model and async no-op tools, and their ratio.

Not a test: it prints figures. Usage::

    python bench/peers.py [--tools 1 5] [--sittings 3] [--peers-venv .venv-peers] [--compare DIR]

LangGraph runs in a virtual environment of its own (``--peers-venv``, made and filled from
PyPI on first use: ``langgraph`` and ``langchain-core`` at ``PEER_REQUIREMENTS``), by
``bench/peers_langgraph.py``: the canonical tool-calling graph (a model node, ``ToolNode``,
``tools_condition``), the model an async ``BaseChatModel`` replaying a script, the tools async
``StructuredTool``s. mana-ai runs ``bench/loop_overhead.py``'s loop with everything on (the
policy gate in ``enforce`` over the in-memory ledger, the mission's reminder channel with
every producer, the compaction check) and bare. Both replay the same script: 5 rounds, every
round but the last calling ``--tools`` no-op tools with other arguments, then an answer.

Each sitting measures LangGraph, then mana-ai, at each tool count (LangGraph the best of 5
runs of 200 loops, mana-ai the best of 5 runs of 2000, each side in a process of its own), so
that the ratio is of figures taken minutes apart on the same machine. With ``--compare DIR``
(an older source tree, e.g. unpacked with ``git archive``) the same mana-ai measurement of
that tree follows in each sitting, the two trees alternating in order. The figures printed
per tool count: each side's range over the sittings, the ratio mana-ai / LangGraph per
sitting (everything on, and bare), and with ``--compare`` the ratio this tree / DIR.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import at_least

ROOT = Path(__file__).resolve().parent.parent

EVERYTHING = "everything on"
BARE = "bare loop"
"""``bench/loop_overhead.py``'s names of the two configurations measured."""

_OURS = """
import asyncio, json, sys
sys.path.insert(0, ".")
from bench.loop_overhead import measure
tools = int(sys.argv[1])
figures = {}
for name in sys.argv[2:]:
    figures.update(asyncio.run(measure(5, tools, 2000, 5, only=name)))
print(json.dumps(figures))
"""
"""mana-ai's side, run in the tree measured (its own ``bench/loop_overhead.py``)."""

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


def ours(tree: Path, tools: int) -> dict[str, float]:
    """The loop of ``tree`` (this one, or ``--compare``'s), bare and with everything on: CPU
    us per round, measured in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-c", _OURS, str(tools), BARE, EVERYTHING],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--tools", type=at_least(1), nargs="+", default=[1, 5])
    parser.add_argument("--sittings", type=at_least(1), default=3)
    parser.add_argument("--peers-venv", type=Path, default=ROOT / ".venv-peers")
    parser.add_argument("--compare", metavar="DIR", type=Path, help="an older source tree")
    args = parser.parse_args()
    python = peers_python(args.peers_venv)
    trees = [ROOT, *([args.compare] if args.compare else [])]
    # per tree and tool count: (LangGraph, everything on, bare) per sitting
    rows: dict[Path, dict[int, list[tuple[float, float, float]]]] = {
        tree: {k: [] for k in args.tools} for tree in trees
    }
    versions: object = None
    for sitting in range(args.sittings):
        for k in args.tools:
            peer = langgraph(python, k)
            versions = peer["versions"]
            theirs = float(peer["us_per_round"])  # type: ignore[arg-type]
            for tree in trees if sitting % 2 == 0 else trees[::-1]:
                figures = ours(tree, k)
                on, bare = figures[EVERYTHING], figures[BARE]
                rows[tree][k].append((theirs, on, bare))
                print(
                    f"sitting {sitting + 1}, {k} tool call(s) per round: LangGraph "
                    f"{theirs:7.0f} us; mana-ai ({tree}) everything on {on:6.1f} us "
                    f"({on / theirs:.3f}x), bare {bare:6.1f} us ({bare / theirs:.3f}x)",
                    flush=True,
                )
    print(f"peers: {versions}")
    for tree in trees:
        for k, figures in rows[tree].items():
            theirs_ = [t for t, _, _ in figures]
            everything = [e for _, e, _ in figures]
            bare_ = [b for _, _, b in figures]
            on_ = [e / t for t, e, _ in figures]
            off = [b / t for t, _, b in figures]
            print(
                f"{tree}, {k} tool call(s) per round: LangGraph "
                f"{min(theirs_):.0f}-{max(theirs_):.0f} us, mana-ai everything on "
                f"{min(everything):.1f}-{max(everything):.1f} us, bare "
                f"{min(bare_):.1f}-{max(bare_):.1f} us per round (CPU); ratio everything on "
                f"{min(on_):.3f}-{max(on_):.3f}x, bare {min(off):.3f}-{max(off):.3f}x"
            )
    if args.compare:
        for k in args.tools:
            pairs = zip(rows[ROOT][k], rows[args.compare][k], strict=True)
            on_ratios, bare_ratios = zip(
                *((new[1] / old[1], new[2] / old[2]) for new, old in pairs), strict=True
            )
            print(
                f"{k} tool call(s) per round, this tree / {args.compare} per sitting: "
                f"everything on {min(on_ratios):.2f}-{max(on_ratios):.2f}, bare "
                f"{min(bare_ratios):.2f}-{max(bare_ratios):.2f}"
            )


if __name__ == "__main__":
    main()
