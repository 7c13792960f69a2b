"""RoBERTa (Liu et al. 2019): BERT's model without NSP, positions numbered from the padding id + 1, byte-level BPE;
masked LM on full sentences. Exports as RobertaForMaskedLM."""
from __future__ import annotations

from pretrain.families import bert
from pretrain.families.base import Family, hf_common

ORDER = 40
FEATURES = dict(bert.FEATURES, heads=["mlm"], position_encoding="roberta")


class RobertaAdapter(bert.BertAdapter):
    hf_class = "RobertaForMaskedLM"
    model_type = "roberta"
    prefix = "roberta."
    keys = {**bert.EMBEDDINGS, "mlm.dense.weight": "lm_head.dense.weight", "mlm.dense.bias": "lm_head.dense.bias",
            "mlm.norm.weight": "lm_head.layer_norm.weight", "mlm.norm.bias": "lm_head.layer_norm.bias",
            "mlm.bias": "lm_head.bias"}
    tied = {"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
            "lm_head.decoder.bias": "lm_head.bias"}
    computes = dict(bert.COMPUTES, position_encoding=("roberta",), heads=("mlm",))
    tokenizer = "roberta"
    tokenizer_class = "RobertaTokenizer"

    def models(self, cfg):
        return [("", cfg, self.hf_class)]

    def hf_config(self, cfg, special):
        """Positions from pad_token_id + 1: the model's padding id, the tokenizer's."""
        import transformers

        common = hf_common(cfg, special, self.hf_class)
        common.update(pad_token_id=cfg.pad_token_id, bos_token_id=special.get("cls"), eos_token_id=special.get("sep"))
        return transformers.RobertaConfig(**common)

    def model_config(self, hf):
        return dict(super().model_config(hf), arch="roberta", heads=["mlm"], pad_token_id=hf.pad_token_id)

    def import_class(self, hf) -> str:
        return self.hf_class


FAMILY = Family("roberta", "RoBERTa: BERT without NSP, positions from the padding id, masked LM on full sentences",
                FEATURES, RobertaAdapter())
