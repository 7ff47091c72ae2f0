"""The gang-deadlock demo, run on the local testbed (``raygpu demo``)."""
