"""The statements of a run's writes under its lease: what it stores as it goes
(``progress``) and how it ends (``ends``), made of the same parts (``parts``)."""
