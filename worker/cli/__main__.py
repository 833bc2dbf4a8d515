"""``python -m worker.cli``: the ``mana-ai`` command."""

from worker.cli import main

raise SystemExit(main())
