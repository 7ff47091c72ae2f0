"""The gang capability's decisions: one reservation's pods for a placement group's bundles
(``reservation.plan_gang``), their shapes (``shapes``), first-fit packing (``pack``), what a template's pods
offer (``capacity``) and what they could bind now (``free``)."""
