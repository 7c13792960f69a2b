"""ptm checkpoints_tools (built by later issues)."""
