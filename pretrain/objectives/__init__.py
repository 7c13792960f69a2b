"""Pretraining objectives applied to samples (masked-LM masking)."""
