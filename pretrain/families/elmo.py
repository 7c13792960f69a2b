"""ELMo (Peters et al. 2018, "Deep contextualized word representations"): a character CNN with highway layers and a
projection, a forward and a backward LSTM language model with projections, clipping and residual connections, one
softmax over the word vocabulary shared by both directions (pretrain/models/elmo.py); the bidirectional LM objective
(pretrain/objectives/bilm.py) on word datasets (`data_prep words`). Exports as bilm-tf's options.json +
weights.hdf5 + vocabulary, which AllenNLP's `Elmo` reads (checkpoints_tools/elmo.py)."""
from __future__ import annotations

from pretrain.families.base import Family

ORDER = 130
FEATURES = dict(norm="post", activation="relu", causal=False, heads=["lm"], scaled_init=False,  # lm: its softmax
                position_encoding="learned", share_layers="none")
PUBLISHED_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]


def check(cfg, need) -> None:
    """ELMo's model is its character CNN and LSTMs: the transformer's options do not apply, and only the softmax splits
    under tensor parallelism."""
    m = cfg.model
    if m.arch != "elmo":
        need(not m.char_filters, f"model.char_filters is ELMo's character CNN (model.arch=elmo), not "
                                 f"model.arch={m.arch}'s; remove it")
        return
    need(bool(m.char_filters) and all(len(f) == 2 and min(f) > 0 for f in m.char_filters),
         f"model.char_filters={m.char_filters} must be [width, filters] pairs of positive numbers (published: "
         f"{PUBLISHED_FILTERS})")
    need(m.activation in ("relu", "tanh"), f"model.activation={m.activation}: ELMo's character CNN has relu or tanh")
    need(cfg.data.objective == "bilm", f"data.objective={cfg.data.objective}: ELMo trains its biLM; set "
                                       f"data.objective=bilm")
    need(not m.activation_checkpointing, "model.activation_checkpointing recomputes transformer layers; ELMo has "
                                         "none: remove it")
    need(cfg.kernels != "compile", "kernels=compile compiles transformer blocks; ELMo has none: set kernels=auto")


FAMILY = Family("elmo", "ELMo: character CNN, forward and backward LSTM LMs with one softmax", FEATURES, None, check)
