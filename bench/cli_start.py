"""CLI start: wall and CPU seconds of ``mana-ai`` commands as processes, beside the floor of a
Python process that does nothing.

Not a test: it prints figures. Usage::

    python bench/cli_start.py [--runs 10] [--mana-ai .venv/bin/mana-ai]

Commands timed: ``python -c pass`` (the floor: the interpreter and ``site``), ``mana-ai
--version``, ``mana-ai --help``, ``mana-ai agents list`` against a migrated database with
three agents (``MANA_AI_TEST_DATABASE_URL``'s server when set, a throw-away database in it;
else an embedded PostgreSQL, already running, so its start is not counted). Each round runs
every command once, in turn, so that a machine shared with other work slows them alike (both
trees' modules byte-compiled first, as an installed package's are); the figures are the
median and the range over ``--runs`` rounds: wall seconds (``time.monotonic`` around the
process) and CPU seconds of the child (user + system, ``resource.getrusage``); then each
command's peak RSS in MiB, from one more run. The ratio printed is each command's median wall
to the floor's; with ``--compare DIR``, also each command's median wall and CPU to the same
command's of the source tree in DIR (CPU is the steadier figure on a machine shared with other
work). ``agents list`` reads through the engine (SQLAlchemy Core on asyncpg, the one SQL
path) on either database. With ``--compare DIR`` the older tree runs on the same database, so
it must know the schema's revision (a tree older than a migration refuses the database).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import at_least, database_server, throwaway_database

ROOT = Path(__file__).resolve().parent.parent


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """``(wall s, CPU s)`` of one run of ``argv``; raises if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, check=False)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{argv} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def summary(values: list[float], unit: str, digits: int = 3) -> str:
    return (
        f"median {statistics.median(values):.{digits}f}{unit} "
        f"({min(values):.{digits}f}-{max(values):.{digits}f})"
    )


def byte_compiled(python: str, tree: str) -> None:
    """Compile the packages of the source tree ``tree`` to ``__pycache__`` (as installing a
    wheel does): a tree run with ``PYTHONDONTWRITEBYTECODE`` or unpacked by ``git archive``
    would otherwise compile every module it imports at every start, and that would be timed."""
    packages = [str(Path(tree) / name) for name in ("planner", "reminders", "worker")]
    subprocess.run([python, "-m", "compileall", "-q", *packages], check=True, capture_output=True)


def prepare(url: str, mana_ai: str, env: dict[str, str]) -> None:
    """Migrate ``url``'s database and add three agents, with the CLI itself."""
    for argv in (
        [mana_ai, "db", "upgrade"],
        *([mana_ai, "agents", "add", "--name", f"bench{n}", "--owner", "me"] for n in range(3)),
    ):
        subprocess.run(argv, env=env, check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--runs", type=at_least(1), default=10, help="rounds of every command")
    parser.add_argument(
        "--mana-ai", default=str(ROOT / ".venv" / "bin" / "mana-ai"), help="the command"
    )
    parser.add_argument(
        "--compare",
        metavar="DIR",
        help="also time the same commands of the source tree in DIR (e.g. an older commit "
        "unpacked with git archive), run by the same interpreter, alternating with these",
    )
    args = parser.parse_args()
    python = str(Path(args.mana_ai).parent / "python")
    with database_server() as (server_url, where):
        asyncio.run(run(args, python, server_url, where))


async def run(args: argparse.Namespace, python: str, server_url: str, where: str) -> None:
    async with throwaway_database(server_url) as url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MANA_AI_")}
        env["MANA_AI_DATABASE_URL"] = url.replace("postgresql+asyncpg://", "postgresql://", 1)
        await asyncio.to_thread(prepare, url, args.mana_ai, env)
        for tree in (str(ROOT), *([args.compare] if args.compare else [])):
            await asyncio.to_thread(byte_compiled, python, tree)
        commands = {"python -c pass": [python, "-c", "pass"]}
        for words in (["--version"], ["--help"], ["agents", "list"]):
            commands[f"mana-ai {' '.join(words)}"] = [args.mana_ai, *words]
            if args.compare:
                # what the console script runs, with DIR first on the path
                script = (
                    f"import sys; sys.path.insert(0, {args.compare!r}); "
                    "from worker.cli import main; sys.exit(main())"
                )
                commands[f"{args.compare}: {' '.join(words)}"] = [python, "-c", script, *words]
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, argv in commands.items():
                figures[name].append(await asyncio.to_thread(timed, argv, env))
        rss = {
            name: await asyncio.to_thread(peak_rss_mib, argv, env)
            for name, argv in commands.items()
        }
    floor = statistics.median(w for w, _ in figures["python -c pass"])
    medians = {name: statistics.median(w for w, _ in runs) for name, runs in figures.items()}
    cpu_medians = {name: statistics.median(c for _, c in runs) for name, runs in figures.items()}
    print(f"{'database':32} {where}")
    print(f"{'runs':32} {args.runs} (commands alternating)")
    for name, runs in figures.items():
        wall = [w for w, _ in runs]
        cpu = [c for _, c in runs]
        print(
            f"{name:32} wall {summary(wall, ' s')}; CPU {summary(cpu, ' s')}; "
            f"peak RSS {rss[name]:.0f} MiB; {statistics.median(wall) / floor:.1f}x the floor"
        )
    if args.compare:
        for words in ("--version", "--help", "agents list"):
            ours, theirs = medians[f"mana-ai {words}"], medians[f"{args.compare}: {words}"]
            ours_cpu = cpu_medians[f"mana-ai {words}"]
            theirs_cpu = cpu_medians[f"{args.compare}: {words}"]
            print(
                f"{words:22}median wall {ours:.3f} s against {theirs:.3f} s: {ours / theirs:.2f}x; "
                f"CPU {ours_cpu:.3f} s against {theirs_cpu:.3f} s: {ours_cpu / theirs_cpu:.2f}x"
            )


def peak_rss_mib(argv: list[str], env: dict[str, str]) -> float:
    """The peak RSS of one run of ``argv``, measured in a child that runs it (so that the
    largest child of this process so far does not stand in for it)."""
    probe = (
        "import resource, subprocess, sys; "
        "subprocess.run(sys.argv[1:], capture_output=True, check=True); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv], env=env, capture_output=True, check=True
    )
    return int(done.stdout) / 1024


if __name__ == "__main__":
    main()
