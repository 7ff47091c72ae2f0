"""Sub-commands of the raygpu CLI, one module each."""
