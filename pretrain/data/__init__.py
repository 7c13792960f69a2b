"""Training data: deterministic samples and batches over ptm-arrow corpora."""
