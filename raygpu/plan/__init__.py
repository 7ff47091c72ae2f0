"""Pure decisions over frozen snapshots: no I/O, no clock (``now_s`` is an argument)."""
