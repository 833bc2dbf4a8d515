"""Log lines carry the ids of the mission whose task logged them."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

import pytest

from worker.logs import bind_log_context, configure_logging


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("restore_root_logger")
async def test_lines_from_any_logger_carry_the_ids_bound_in_their_task(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("INFO", "json")

    async def mission(mission_id: int) -> None:
        bind_log_context(mission_id=mission_id)
        await asyncio.sleep(0)
        bind_log_context(iteration_id=mission_id * 10)
        logging.getLogger("planner.loop").warning("llm request failed")
        await asyncio.to_thread(logging.getLogger("llama").info, "in a thread")

    await asyncio.gather(mission(1), mission(2))
    logging.getLogger("worker.daemon.worker").info("between missions")

    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    by_msg = {(line["msg"], line.get("mission_id")): line for line in lines}
    for mission_id in (1, 2):
        for msg in ("llm request failed", "in a thread"):
            assert by_msg[(msg, mission_id)]["iteration_id"] == mission_id * 10
    [outside] = [line for line in lines if line["msg"] == "between missions"]
    assert "mission_id" not in outside


@pytest.mark.usefixtures("restore_root_logger")
def test_text_format_quotes_values_with_spaces(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", "text")
    logging.getLogger("x").info("hello %s", "world", extra={"mission_id": 3})
    line = capsys.readouterr().err.strip()
    assert 'msg="hello world"' in line and "mission_id=3" in line and "level=info" in line
