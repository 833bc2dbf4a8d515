"""mana-ai's planner: the agent loop core (LLM ↔ tools), importable and testable on its own.

The public surface is pinned by ``tests/unit/test_public_api.py``.
"""

import lazy_loader

# Each name is imported from its module on first use (the modules are named in __init__.pyi),
# so that importing one module of the planner (``planner.errors`` for the error tree) does not
# load all of it: ``mana-ai --version`` and ``--help`` start without pydantic or jsonschema.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
