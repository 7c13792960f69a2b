"""Activation checkpointing (model.activation_checkpointing): which layers recompute in the backward, and the
recomputation that draws the forward's dropout masks again."""
from __future__ import annotations

from torch.utils.checkpoint import checkpoint as torch_checkpoint

from pretrain.parallel import mcore


def checkpointed_layers(setting, num_layers) -> set[int]:
    """The layers model.activation_checkpointing names (true: every layer)."""
    if setting is True:
        return set(range(num_layers))
    return set(setting or ())


def checkpoint(block, *args, **kwargs):
    """Activation checkpointing whose recomputation draws the dropout masks of the forward, eager or compiled, on
    CPU or CUDA, by construction: each of the two generators dropout draws from is set back to its state at the
    forward before the block runs again.
    * The default generator (hidden dropout; in a compiled block Inductor's kernels draw their seeds from it):
      torch's checkpoint restores the CPU generator and those of the inputs' CUDA devices (preserve_rng_state).
    * The TP RNG tracker (attention dropout on this rank's heads; megatron's CudaRNGStatesTracker on CUDA, ptm's
      CpuRNGStatesTracker on CPU): its states are taken here and set again around the recomputation. They are
      tensors that each fork replaces, never changes in place (megatron's tracker without CUDA-graph-safe RNG, as
      ptm seeds it). Its fork runs eager even in a compiled block (`layers.on_tp_generator`), so no compiled graph
      holds a generator switch or a generator state: a graph draws from the default generator as it finds it, like
      an eager kernel, and the recomputation runs the same graphs (same shapes and grad mode) in the same order."""
    states = mcore.rng_tracker().get_states()
    ran = []

    def run(*args, **kwargs):
        if not ran:
            ran.append(True)
            return block(*args, **kwargs)
        current = mcore.rng_tracker().get_states()
        mcore.rng_tracker().set_states(states)
        try:
            return block(*args, **kwargs)
        finally:
            mcore.rng_tracker().set_states(current)

    return torch_checkpoint(run, *args, use_reentrant=False, **kwargs)
