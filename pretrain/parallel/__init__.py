"""Parallelism: megatron-core process groups and TP layers on any device."""
