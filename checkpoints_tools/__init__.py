"""Checkpoint tools: Hugging Face export/import (`python -m checkpoints_tools --help`)."""
