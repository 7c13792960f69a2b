"""ALBERT (Lan et al. 2020): factorised embeddings (model.embedding_size) projected to the hidden size, one layer's
parameters shared by every layer, tanh GELU; masked LM + sentence order prediction. Exports as AlbertForPreTraining
(one layer group of one layer)."""
from __future__ import annotations

from pretrain.families import bert
from pretrain.families.base import ExportError, Family, hf_common

ORDER = 50
FEATURES = dict(bert.FEATURES, activation="gelu_tanh", share_layers="all")


class AlbertAdapter(bert.BertAdapter):
    hf_class = "AlbertForPreTraining"
    model_type = "albert"
    tokenizer_class = "AlbertTokenizer"
    prefix = "albert."
    layer = "{p}encoder.albert_layer_groups.0.albert_layers.{i}."
    qkv = "attention"
    layer_keys = {
        "attn.out.weight": "attention.dense.weight", "attn.out.bias": "attention.dense.bias",
        "attn_norm.weight": "attention.LayerNorm.weight", "attn_norm.bias": "attention.LayerNorm.bias",
        "mlp.fc1.weight": "ffn.weight", "mlp.fc1.bias": "ffn.bias",
        "mlp.fc2.weight": "ffn_output.weight", "mlp.fc2.bias": "ffn_output.bias",
        "mlp_norm.weight": "full_layer_layer_norm.weight", "mlp_norm.bias": "full_layer_layer_norm.bias",
    }
    keys = {**bert.EMBEDDINGS,
            "embeddings.proj.weight": "{p}encoder.embedding_hidden_mapping_in.weight",
            "embeddings.proj.bias": "{p}encoder.embedding_hidden_mapping_in.bias",
            "pooler.weight": "{p}pooler.weight", "pooler.bias": "{p}pooler.bias",
            "mlm.dense.weight": "predictions.dense.weight", "mlm.dense.bias": "predictions.dense.bias",
            "mlm.norm.weight": "predictions.LayerNorm.weight", "mlm.norm.bias": "predictions.LayerNorm.bias",
            "mlm.bias": "predictions.bias",
            "nsp.weight": "sop_classifier.classifier.weight", "nsp.bias": "sop_classifier.classifier.bias"}
    tied = {"predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
            "predictions.decoder.bias": "predictions.bias"}
    computes = {**{k: v for k, v in bert.COMPUTES.items() if k != "embedding_size"}, "share_layers": ("all",),
                "heads": ("mlm", "nsp")}

    def blocks(self, num_layers: int) -> int:
        return 1  # every layer is the one shared layer

    def models(self, cfg):
        return [("", cfg, self.hf_class)]

    def hf_config(self, cfg, special):
        import transformers

        return transformers.AlbertConfig(embedding_size=cfg.embedding_size or cfg.hidden_size, num_hidden_groups=1,
                                         inner_group_num=1, bos_token_id=special.get("cls"),
                                         eos_token_id=special.get("sep"), **hf_common(cfg, special, self.hf_class))

    def model_config(self, hf):
        if (hf.num_hidden_groups, hf.inner_group_num) != (1, 1):
            raise ExportError(f"ALBERT with num_hidden_groups={hf.num_hidden_groups}, inner_group_num="
                              f"{hf.inner_group_num}: ptm imports one shared layer (1, 1), as every released ALBERT has")
        return dict(super().model_config(hf), arch="albert", heads=["mlm", "nsp"],
                    embedding_size=hf.embedding_size if hf.embedding_size != hf.hidden_size else 0)

    def import_class(self, hf) -> str:
        return self.hf_class


FAMILY = Family("albert", "ALBERT: factorised embeddings, one layer shared by all, masked LM + sentence order",
                FEATURES, AlbertAdapter())
