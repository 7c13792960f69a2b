"""Hugging Face <-> ptm weights of a family (`model.arch`) as plain key maps plus the QKV and Conv1D reshapes, on full
(single-rank, fp32) state dicts: the family's adapter (pretrain/families/) holds the maps. HF -> ptm -> HF is
bit-exact."""
from __future__ import annotations

from pretrain import families
__all__ = ["from_hf", "to_hf"]


def from_hf(arch: str, hf: dict, num_layers: int, num_heads: int, vocab_rows: int,
            task_types: bool = False) -> tuple[dict, list[str]]:
    """HF state dict -> ptm state dict; also returns the ptm keys HF did not have (heads to initialise)."""
    return families.get(arch).adapter.from_hf(hf, num_layers, num_heads, vocab_rows, task_types)


def to_hf(arch: str, ours: dict, num_layers: int, num_heads: int, vocab_size: int) -> dict:
    """ptm state dict -> HF state dict (padding rows dropped; tied decoder weights included)."""
    return families.get(arch).adapter.to_hf(ours, num_layers, num_heads, vocab_size)
