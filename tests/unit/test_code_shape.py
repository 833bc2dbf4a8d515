"""The code keeps the shape the design holds it to (``bench/code_shape.py`` prints the
figures): no module of ``planner``, ``reminders`` or ``worker`` over 500 lines, no function over
60, no import circle among them."""

from __future__ import annotations

from bench.code_shape import MAX_FUNCTION_LINES, MAX_MODULE_LINES, measure


def test_no_module_or_function_is_over_its_limit_and_no_import_circle() -> None:
    shape = measure()
    assert shape.modules > 100 and shape.functions > 1000  # it read the project
    assert shape.modules_over == [], f"modules over {MAX_MODULE_LINES} lines"
    assert shape.functions_over == [], f"functions over {MAX_FUNCTION_LINES} lines"
    assert shape.circles == []
