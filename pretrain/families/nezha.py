"""NEZHA (Wei et al. 2019): BERT's model with functional relative positions (fixed sinusoids of the clipped distance
added to keys and values inside attention) instead of a position table. transformers ships no NEZHA class:
checkpoints_tools/nezha/ holds ptm's modeling file, written next to the exported weights with an `auto_map`
(load with trust_remote_code=True)."""
from __future__ import annotations

import os

from pretrain.families import bert
from pretrain.families.base import Family, hf_common

ORDER = 70
FEATURES = dict(bert.FEATURES, position_encoding="relative")
AUTO_MAP = {"AutoConfig": "configuration_nezha.NezhaConfig", "AutoModel": "modeling_nezha.NezhaModel",
            "AutoModelForPreTraining": "modeling_nezha.NezhaForPreTraining",
            "AutoModelForMaskedLM": "modeling_nezha.NezhaForMaskedLM"}


class NezhaAdapter(bert.BertAdapter):
    hf_class = "NezhaForPreTraining"
    masked_lm_class = "NezhaForMaskedLM"
    model_type = "nezha"
    prefix = "nezha."
    keys = {**{k: v for k, v in bert.EMBEDDINGS.items() if k != "embeddings.position.weight"}, **bert.HEADS}
    computes = dict(bert.COMPUTES, position_encoding=("relative",))

    def hf_config(self, cfg, special):
        from checkpoints_tools.nezha.configuration_nezha import NezhaConfig

        return NezhaConfig(max_relative_position=cfg.max_relative_position, auto_map=AUTO_MAP,
                           **hf_common(cfg, special, self.models(cfg)[0][2]))

    def model_config(self, hf):
        return dict(super().model_config(hf), arch="nezha", max_relative_position=hf.max_relative_position)

    def hf_model_class(self, name: str):
        """ptm's own classes, never the code of a directory being imported."""
        from checkpoints_tools.nezha import modeling_nezha

        return getattr(modeling_nezha, name)

    def hf_config_class(self):
        from checkpoints_tools.nezha.configuration_nezha import NezhaConfig

        return NezhaConfig

    def files(self) -> list[str]:
        from checkpoints_tools import nezha

        return [os.path.join(os.path.dirname(nezha.__file__), name)
                for name in ("configuration_nezha.py", "modeling_nezha.py")]


FAMILY = Family("nezha", "NEZHA: BERT with functional relative positions", FEATURES, NezhaAdapter())
