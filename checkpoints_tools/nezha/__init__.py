"""NEZHA for Hugging Face transformers, which no longer ships it: ptm writes these two files next to an exported
NEZHA's weights, and `AutoModel.from_pretrained(dir, trust_remote_code=True)` loads them from there."""
