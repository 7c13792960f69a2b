"""ptm launchers (built by later issues)."""
