"""pretrain: models, objectives, data and the training loop (`python -m pretrain --help`)."""
import warnings

# megatron-core announces at import that the optional NVIDIA apex / Transformer Engine are absent; ptm
# never requires them, so the notice is noise. (Set before anything imports megatron-core.)
warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
warnings.filterwarnings("ignore", message=".*torch.jit.script_method. is deprecated")
# torch deprecates the collective that megatron-core and DeepSpeed call (their business, not a user's).
warnings.filterwarnings("ignore", message="`torch.distributed.all_gather_into_tensor` is deprecated")
