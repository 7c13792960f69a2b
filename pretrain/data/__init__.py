"""Deterministic training samples over ptm Arrow datasets (GPT-2 windows, BERT/ERNIE pairs, blending, loaders)."""
