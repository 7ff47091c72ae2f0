"""The starvation guard as a capability of its own (docs/guard.md).

``holder``: one guarded gang's guard, run by its driver's watchdog: it queues for its scope, holds it, blocks
nodes and swaps the gang in; each step observes, calls the one pure plan ``raygpu.plan.guard.plan_guard_step``
and acts. ``backfill``: an unguarded gang with a runtime hint that runs on held nodes when it ends first. The
pure parts stay under ``raygpu.plan`` (``plan.guard``, ``plan.backfill``) and ``raygpu.model.guard``, as every
capability's do; ``raygpu.gang`` runs these two from its watchdog, never the other way round.
"""
