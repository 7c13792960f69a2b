"""ptm pretrain (built by later issues)."""
