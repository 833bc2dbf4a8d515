"""The embedded model's two runtimes side by side: load, prefill and decode speed, the quick
start's two completions, peak memory.

Not a test: it prints the figures of each runtime and their ratio. Usage::

    python bench/local_model.py [--rounds 3] [--threads 1]

Each measurement runs in a process of its own (so each load is cold for the interpreter and
peak RSS is the runtime's), the runtimes alternating, ``--rounds`` times: numpy
(``LocalNumpyChatModel``'s model) and llama-cpp-python (``LocalLlamaChatModel``'s), both with
``--threads`` threads (default 1, the providers' default on 2 cores). A measurement is:

- load: the GGUF file read until the first request could start (numpy: reading,
  dequantizing, tokenizer and grammar tokenizer; llama.cpp: ``Llama(...)``);
- prefill: a 300-token prompt in one batch, tokens per second;
- decode: 32 tokens one at a time after it, with the full vocabulary's logits each time;
- quick start: the README mission's two completions through the provider (a ``clock_now``
  call, then the answer from its result), seconds, and whether the answer holds the time;
- peak RSS of the process.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RUNTIMES = ("numpy", "llama-cpp")


def _prompt_text() -> str:
    words = "the clock said it was time to write a note about the weather and the day " * 30
    return f"<|im_start|>user\n{words}<|im_end|>\n<|im_start|>assistant\n"


def measure_numpy(threads: int) -> dict[str, Any]:
    from worker.llm.embedded.local import default_model_path
    from worker.llm.embedded.local_numpy import _Runtime

    started = time.perf_counter()
    runtime = _Runtime(default_model_path(), n_ctx=2048, n_threads=threads)
    load = time.perf_counter() - started
    prompt = runtime.tokenizer.encode(_prompt_text()).ids[:300]
    with runtime.threads(threads):
        model = runtime.model
        started = time.perf_counter()
        hidden = model.eval(prompt)
        prefill = time.perf_counter() - started
        started = time.perf_counter()
        for token in prompt[:32]:
            model.logits(hidden)
            hidden = model.eval([token])
        decode = time.perf_counter() - started
    return {"load_s": load, "prefill_s": prefill, "n_prompt": len(prompt), "decode_s": decode}


def measure_llama(threads: int) -> dict[str, Any]:
    import llama_cpp

    from worker.llm.embedded.local import default_model_path

    started = time.perf_counter()
    llama = llama_cpp.Llama(
        model_path=str(default_model_path()),
        n_ctx=2048,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    load = time.perf_counter() - started
    prompt = llama.tokenize(_prompt_text().encode(), add_bos=False, special=True)[:300]
    started = time.perf_counter()
    llama.eval(prompt)
    prefill = time.perf_counter() - started
    started = time.perf_counter()
    for token in prompt[:32]:
        llama.eval([token])  # the logits of every step are copied out (as a sampler reads them)
    decode = time.perf_counter() - started
    llama.close()
    return {"load_s": load, "prefill_s": prefill, "n_prompt": len(prompt), "decode_s": decode}


async def quick_start(runtime: str, threads: int) -> dict[str, Any]:
    from planner import ChatMessage, CompletionRequest
    from worker.cli.agents_cli import DEFAULT_SYSTEM_PROMPT
    from worker.llm.embedded.local import LocalLlamaChatModel
    from worker.llm.embedded.local_numpy import LocalNumpyChatModel
    from worker.tools import clock_tools

    llm: Any = (
        LocalNumpyChatModel(n_threads=threads)
        if runtime == "numpy"
        else LocalLlamaChatModel(n_threads=threads)
    )
    tools = [spec.to_openai_tool() for spec in clock_tools()]
    objective = "What time is it? Use the clock tool and answer with the time."
    messages = [
        ChatMessage(role="system", content=DEFAULT_SYSTEM_PROMPT),
        ChatMessage(role="user", content=objective),
    ]
    await llm.complete(CompletionRequest(messages=messages, tools=tools))  # loads the model
    started = time.perf_counter()
    call = await llm.complete(CompletionRequest(messages=messages, tools=tools))
    result = {"now": "2026-12-02T07:41:09+00:00", "date": "2026-12-02", "time": "07:41:09"}
    messages += [
        call.message,
        ChatMessage(
            role="tool",
            tool_call_id=call.message.tool_calls[0].id if call.message.tool_calls else "x",
            content=json.dumps(result),
        ),
    ]
    answer = await llm.complete(CompletionRequest(messages=messages, tools=tools))
    seconds = time.perf_counter() - started
    await llm.aclose()
    return {"quick_start_s": seconds, "answered": "07:41:09" in (answer.message.content or "")}


def child(runtime: str, threads: int) -> None:
    import asyncio

    figures = measure_numpy(threads) if runtime == "numpy" else measure_llama(threads)
    figures |= asyncio.run(quick_start(runtime, threads))
    figures["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", choices=RUNTIMES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.threads)
        return
    results: dict[str, list[dict[str, Any]]] = {r: [] for r in RUNTIMES}
    for round_ in range(1, args.rounds + 1):
        for runtime in RUNTIMES:
            done = subprocess.run(
                [sys.executable, __file__, "--child", runtime, "--threads", str(args.threads)],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise SystemExit(f"{runtime} failed:\n{done.stderr[-3000:]}")
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            results[runtime].append(figures)
            verdict = "answered" if figures["answered"] else "WRONG"
            print(
                f"round {round_} {runtime:<9} load {figures['load_s']:5.2f} s, prefill "
                f"{figures['n_prompt'] / figures['prefill_s']:6.0f} tok/s, decode "
                f"{32 / figures['decode_s']:5.1f} tok/s, quick start "
                f"{figures['quick_start_s']:5.2f} s ({verdict}), "
                f"peak RSS {figures['peak_rss_mib']:.0f} MiB",
                flush=True,
            )

    def median(runtime: str, key: str) -> float:
        return statistics.median(f[key] for f in results[runtime])

    print("median        numpy    llama-cpp   numpy / llama-cpp")
    for label, key in [
        ("load s", "load_s"),
        ("prefill s", "prefill_s"),
        ("decode s", "decode_s"),
        ("quick start s", "quick_start_s"),
        ("peak RSS MiB", "peak_rss_mib"),
    ]:
        a, b = median("numpy", key), median("llama-cpp", key)
        print(f"{label:<13} {a:8.2f} {b:10.2f} {a / b:12.2f}x")


if __name__ == "__main__":
    main()
