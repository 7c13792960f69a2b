"""The pretraining models: `build(cfg)` is XLNet / Transformer-XL (xlnet.py) with their relative positions, an
encoder-decoder (seq2seq.py) when the config gives the model a decoder stack, ELMo's biLM (elmo.py) when it gives
it a character CNN, else the encoder or decoder of model.py."""


def build(cfg, heads=None, tp=None):
    """The model of ModelConfig `cfg` over TP group `tp`, with an objective's `heads`."""
    if cfg.position_encoding == "transformer_xl":
        from pretrain.models.xlnet import XLNet

        return XLNet(cfg, heads=heads, tp=tp)
    if cfg.char_filters:
        from pretrain.models.elmo import ELMo

        return ELMo(cfg, heads=heads, tp=tp)
    if cfg.decoder_layers:
        from pretrain.models.seq2seq import EncoderDecoder

        return EncoderDecoder(cfg, heads=heads, tp=tp)
    from pretrain.models.model import Pretraining

    return Pretraining(cfg, heads=heads, tp=tp)
