"""The sidecar's decisions: one cycle (``cycle.plan_cycle``) of garbage collection (``gc``) and scale-down
(``scale_down.plan_reclaim``), which keeps the workers pending placement groups need (``pending``,
``placement``, ``together``), orders candidates (``occupants``), narrows to what Ray drained (``drain``), and
learns how many idle workers to keep warm (``warm``)."""
