"""The quick start's success rate: README's run command, mission by mission, judged.

Not a test: it prints one line per run and the rate. Usage::

    python bench/quickstart.py [--runs 20] [--runtime auto|numpy|llama-cpp ...]

It takes the ``agents add`` and ``missions add`` command lines from README's run-command
block, runs ``agents add`` once, then for each run ``missions add``, ``tick --once`` and
``iterations show latest --json`` as processes (as an operator would: each tick loads the
embedded model), with the embedded model (``MANA_AI_LLM_BASE_URL`` unset) on the runtime
``--runtime`` names (``MANA_AI_LOCAL_RUNTIME``; with several, each run on each in turn, and
the seconds of ``missions add`` and ``tick --once`` per runtime at the end). A run succeeds
when the iteration succeeded with a final answer, every tool call ran without error, the
answer holds the time ``clock_now`` returned (``HH:MM:SS``) and no figure that no tool
returned (``iterations.unsupported_figures``, what the verdict line checks).

Database: a throwaway database on the ``MANA_AI_TEST_DATABASE_URL`` server (dropped
afterwards), else an embedded PostgreSQL in a temporary data directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import create_database, drop_database  # noqa: E402
from worker.admin.verdict import unsupported_figures  # noqa: E402
from worker.database_url import to_async_url  # noqa: E402


def readme_commands() -> tuple[list[str], list[str]]:
    """The arguments of ``mana-ai agents add …`` and ``mana-ai missions add …`` in README's
    run-command block."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- run-command -->", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = []
    for segment in block.replace("\\\n", " ").split("&&"):
        words = shlex.split(segment)
        if words and words[0].endswith("/mana-ai"):
            commands.append(words[1:])
    agents = next(c for c in commands if c[:2] == ["agents", "add"])
    missions = next(c for c in commands if c[:2] == ["missions", "add"])
    return agents, missions


def mana_ai(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def judge(iteration: dict[str, Any]) -> list[str]:
    """What went wrong in one quick-start iteration (empty: it did its job)."""
    problems = []
    if iteration["status"] != "succeeded" or iteration["stop_reason"] != "final_answer":
        problems.append(f"{iteration['status']} ({iteration['stop_reason']})")
    calls = iteration["tool_invocations"]
    problems += [f"{c['tool']} {c['outcome']}" for c in calls if c["outcome"] != "ok"]
    clock = [c["result"] for c in calls if c["tool"] == "clock_now" and c["outcome"] == "ok"]
    last = iteration["messages"][-1] if iteration["messages"] else {}
    answer = last.get("content") or "" if last.get("role") == "assistant" else ""
    if not clock:
        problems.append("clock_now did not run")
    elif clock[-1]["time"] not in answer:
        problems.append(f"the answer lacks {clock[-1]['time']}")
    known = "\n".join(json.dumps(c["result"]) for c in calls) + "\n".join(
        str(m.get("content")) for m in iteration["messages"] if m["role"] != "assistant"
    )
    made_up = unsupported_figures(answer, known)
    if made_up:
        problems.append(f"made up: {', '.join(made_up)}")
    return problems


def bench(env: dict[str, str], runs: int, runtimes: list[str]) -> None:
    agents, missions = readme_commands()
    print(f"agents add   {shlex.join(agents[2:])}")
    print(f"missions add {shlex.join(missions[2:])}")
    for command in (["db", "upgrade"], agents):
        done = mana_ai(env, *command)
        if done.returncode != 0:
            raise SystemExit(f"mana-ai {shlex.join(command)} failed: {done.stderr}")
    succeeded = dict.fromkeys(runtimes, 0)
    seconds: dict[str, list[float]] = {runtime: [] for runtime in runtimes}
    for run in range(1, runs + 1):
        for runtime in runtimes:  # alternating: the same sitting for each
            runtime_env = env | {"MANA_AI_LOCAL_RUNTIME": runtime}
            started = time.perf_counter()
            for command in (missions, ["tick", "--once"]):
                mana_ai(runtime_env, *command)
            elapsed = time.perf_counter() - started
            shown = mana_ai(env, "iterations", "show", "latest", "--json")
            iteration = json.loads(shown.stdout)
            problems = judge(iteration)
            succeeded[runtime] += not problems
            seconds[runtime].append(elapsed)
            last = iteration["messages"][-1] if iteration["messages"] else {}
            answer = re.sub(r"\s+", " ", str(last.get("content")))[:80]
            print(
                f"run {run:>2} {runtime:<9}: {'ok ' if not problems else 'BAD'} "
                f"{elapsed:5.1f} s  answer {answer!r}"
                + (f"  ({'; '.join(problems)})" if problems else ""),
                flush=True,
            )
    for runtime in runtimes:
        times = sorted(seconds[runtime])
        print(
            f"{runtime:<9} succeeded {succeeded[runtime]}/{runs}; missions add + tick "
            f"median {statistics.median(times):.1f} s (min {times[0]:.1f}, max {times[-1]:.1f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument(
        "--runtime",
        nargs="+",
        choices=["auto", "numpy", "llama-cpp"],
        default=["auto"],
        help="the embedded model's runtime (MANA_AI_LOCAL_RUNTIME; default auto); with more "
        "than one, each run runs on each, alternating",
    )
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MANA_AI_")}
    env |= {"MANA_AI_METRICS_PORT": "0", "MANA_AI_LOG_LEVEL": "WARNING"}
    print(f"runtime      {' '.join(args.runtime)}")
    server = os.environ.get("MANA_AI_TEST_DATABASE_URL")
    if server:
        server_url = to_async_url(server)
        url = asyncio.run(create_database(server_url, "mana_ai_quickstart"))
        print("database     a throwaway database on MANA_AI_TEST_DATABASE_URL's server")
        try:
            bench(env | {"MANA_AI_DATABASE_URL": url}, args.runs, args.runtime)
        finally:
            asyncio.run(drop_database(server_url, url))
        return
    with tempfile.TemporaryDirectory(prefix="mana-ai-quickstart-") as tmp:
        Path(tmp).chmod(0o755)  # as root the embedded server's user must enter it
        print(f"database     embedded PostgreSQL in {tmp}")
        bench(env | {"MANA_AI_DATA_DIR": tmp}, args.runs, args.runtime)


if __name__ == "__main__":
    main()
