"""The doctor's pure decisions: checks over one frozen Snapshot, the stranded-GPU arithmetic, the repair plan."""
