"""What every capability's planner shares: the snapshot's Ray join (``index``), free capacity by shape and the
fit rule (``free_index``), tested RayCluster JSON patches (``patch``), and the collector pause a caller may
take around a planner (``collector``)."""
