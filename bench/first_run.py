"""The first run on a fresh machine: README's run command, verbatim, with no pip cache.

Not a test: it prints the wall time and the figures it is judged by (issue 20: at most 3
minutes). Usage::

    python bench/first_run.py [--commit HEAD] [--keep]

It unpacks ``--commit`` of this repository (``git archive``) into a temporary directory, as a
fresh clone would be, and runs the block after ``<!-- run-command -->`` in README there with
``bash -euo pipefail`` under ``/usr/bin/time -v``: a new virtual environment, pip with
``PIP_NO_CACHE_DIR=1`` (every package downloaded and, for an sdist, built again; what a
machine that never ran pip has), a new data directory for the embedded PostgreSQL, no
``MANA_AI_*`` variable but ``MANA_AI_DATA_DIR`` and ``MANA_AI_METRICS_PORT=0``. Then it prints
wall and CPU seconds, peak RSS of the largest process, for the install part (the virtual
environment and the ``pip install`` commands) and the rest (the ``mana-ai`` commands) run one
after the other, their sum, and the last line of ``iterations show`` (the verdict).

The packages still come from the machine's package index, so the network's speed is part of
the figure, as it is for a newcomer.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_command_block() -> str:
    """The shell text after ``<!-- run-command -->`` in README.md."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return readme.split("<!-- run-command -->", 1)[1].split("```sh", 1)[1].split("```", 1)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default="HEAD", help="the tree to unpack (default HEAD)")
    parser.add_argument("--keep", action="store_true", help="leave the directory behind")
    args = parser.parse_args()
    if not Path("/usr/bin/time").exists():
        raise SystemExit("needs /usr/bin/time (Debian: apt-get install time)")
    work = Path(tempfile.mkdtemp(prefix="mana-ai-first-run-"))
    work.chmod(0o755)  # as root, the embedded server's user must enter the data directory
    try:
        tree, data = work / "mana-ai", work / "data"
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.commit],
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        install, run = split_block(run_command_block())
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MANA_AI_", "PIP_"))}
        env |= {
            "PIP_NO_CACHE_DIR": "1",
            "MANA_AI_DATA_DIR": str(data),
            "MANA_AI_METRICS_PORT": "0",
        }
        print(f"tree         {args.commit} unpacked in {tree}")
        print("command      README's run-command block, PIP_NO_CACHE_DIR=1, a new data directory")
        phases = [timed("install", install, tree, env), timed("run", run, tree, env)]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for phase in phases:
        print(
            f"{phase.name:<12} {phase.wall_s:6.1f} s wall, {phase.cpu_s:6.1f} s CPU, "
            f"peak RSS {phase.rss_mib:.0f} MiB, exit status {phase.status}"
        )
    wall = sum(p.wall_s for p in phases)
    print(f"first run    {wall:6.1f} s wall (goal: at most 180 s)")
    verdict = next(
        (line for line in reversed(phases[1].lines) if line.startswith("verdict:")), None
    )
    print(f"verdict      {verdict or '(none)'}")
    failed = next((p for p in phases if p.status != 0), None)
    if failed is not None or verdict is None:
        print("\n".join((failed or phases[1]).lines[-40:]))
        sys.exit(1)


@dataclass
class Phase:
    """One part of the run command as it ran: its output lines and ``/usr/bin/time -v``'s
    figures (CPU of every process, peak RSS of the largest)."""

    name: str
    status: int
    wall_s: float
    cpu_s: float
    rss_mib: float
    lines: list[str]


def split_block(block: str) -> tuple[str, str]:
    """The run command's install part (up to its last ``pip install``) and the rest, each a
    shell command; run one after the other they are the block itself."""
    segments = [s.strip() for s in block.replace("\\\n", " ").split("&&")]
    last = max(i for i, s in enumerate(segments) if " install " in s)
    return " && ".join(segments[: last + 1]), " && ".join(segments[last + 1 :])


def timed(name: str, command: str, cwd: Path, env: dict[str, str]) -> Phase:
    """Run ``command`` with ``bash -euo pipefail`` under ``/usr/bin/time -v``."""
    started = time.perf_counter()
    done = subprocess.run(
        ["/usr/bin/time", "-v", "bash", "-euo", "pipefail", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    stats = dict(re.findall(r"^\s+(.+?): (.+)$", done.stderr, flags=re.MULTILINE))
    cpu = float(stats.get("User time (seconds)", 0)) + float(stats.get("System time (seconds)", 0))
    rss = int(stats.get("Maximum resident set size (kbytes)", 0)) / 1024
    lines = (done.stdout + done.stderr).splitlines()
    return Phase(name, done.returncode, wall, cpu, rss, lines)


if __name__ == "__main__":
    main()
