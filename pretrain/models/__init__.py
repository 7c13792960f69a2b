"""The pretraining models: `build(cfg)` is the model class its family names (`Family.model`): the encoder or decoder
of model.py, an encoder-decoder (seq2seq.py), XLNet / Transformer-XL (two_stream.py), ELMo's biLM (char_bilm.py)."""
import importlib


def model_class(cfg):
    """The model class of ModelConfig `cfg`'s family."""
    from pretrain import families

    module, name = families.get(cfg.arch).model.split(":")
    return getattr(importlib.import_module(module), name)


def build(cfg, heads=None, tp=None):
    """The model of ModelConfig `cfg` over TP group `tp`, with an objective's `heads`."""
    return model_class(cfg)(cfg, heads=heads, tp=tp)
