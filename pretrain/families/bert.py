"""BERT (Devlin et al. 2019): post-LN encoder, learned positions, GELU; masked LM + next sentence prediction.
Exports as BertForPreTraining, or BertForMaskedLM for a model without the NSP head (e.g. UniLM's)."""
from __future__ import annotations

from pretrain.families.base import Adapter, Family, hf_common, model_common

ORDER = 10
FEATURES = dict(norm="post", activation="gelu", causal=False, heads=["mlm", "nsp"], scaled_init=False,
                position_encoding="learned", share_layers="none")
LAYER_KEYS = {  # ptm block parameter -> BERT's layer names (ERNIE, NEZHA and ELECTRA name theirs alike)
    "attn.out.weight": "attention.output.dense.weight", "attn.out.bias": "attention.output.dense.bias",
    "attn_norm.weight": "attention.output.LayerNorm.weight", "attn_norm.bias": "attention.output.LayerNorm.bias",
    "mlp.fc1.weight": "intermediate.dense.weight", "mlp.fc1.bias": "intermediate.dense.bias",
    "mlp.fc2.weight": "output.dense.weight", "mlp.fc2.bias": "output.dense.bias",
    "mlp_norm.weight": "output.LayerNorm.weight", "mlp_norm.bias": "output.LayerNorm.bias",
}
EMBEDDINGS = {
    "embeddings.word.weight": "{p}embeddings.word_embeddings.weight",
    "embeddings.position.weight": "{p}embeddings.position_embeddings.weight",
    "embeddings.token_type.weight": "{p}embeddings.token_type_embeddings.weight",
    "embeddings.norm.weight": "{p}embeddings.LayerNorm.weight", "embeddings.norm.bias": "{p}embeddings.LayerNorm.bias",
}
HEADS = {  # BertForPreTraining's (the pooler, the MLM transform and bias, the NSP classifier)
    "pooler.weight": "{p}pooler.dense.weight", "pooler.bias": "{p}pooler.dense.bias",
    "mlm.dense.weight": "cls.predictions.transform.dense.weight",
    "mlm.dense.bias": "cls.predictions.transform.dense.bias",
    "mlm.norm.weight": "cls.predictions.transform.LayerNorm.weight",
    "mlm.norm.bias": "cls.predictions.transform.LayerNorm.bias",
    "mlm.bias": "cls.predictions.bias",
    "nsp.weight": "cls.seq_relationship.weight", "nsp.bias": "cls.seq_relationship.bias",
}
TIED = {"cls.predictions.decoder.weight": "{p}embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias"}
# what BERT-style HF classes compute: post-LN, bidirectional, learned absolute positions, unshared layers
COMPUTES = dict(norm=("post",), embedding_norm=(None, True), activation=("gelu", "gelu_tanh"), causal=(False,),
                position_encoding=("learned",),
                share_layers=("none",), heads=("mlm", "nsp"), embedding_size=(0,), task_type_vocab_size=(0,))


class BertAdapter(Adapter):
    hf_class = "BertForPreTraining"
    model_type = "bert"
    prefix = "bert."
    layer_keys = LAYER_KEYS
    keys = {**EMBEDDINGS, **HEADS}
    computes = COMPUTES
    tokenizer_class = "BertTokenizer"  # (ERNIE's, NEZHA's and ELECTRA's too)
    masked_lm_class = "BertForMaskedLM"  # the class of a model without the NSP head

    @property
    def tied(self):
        return {k: v.format(p=self.prefix) for k, v in TIED.items()}

    def models(self, cfg):
        return [("", cfg, self.hf_class if "nsp" in cfg.heads else self.masked_lm_class)]

    def hf_config(self, cfg, special):
        import transformers

        return transformers.BertConfig(**hf_common(cfg, special, self.models(cfg)[0][2]))

    def model_config(self, hf):
        heads = ["mlm"] if self.masked_lm_class in (hf.architectures or []) else ["mlm", "nsp"]
        return dict(model_common(hf, "bert"), heads=heads)

    def import_class(self, hf) -> str:
        return self.masked_lm_class if self.masked_lm_class in (hf.architectures or []) else self.hf_class


FAMILY = Family("bert", "BERT: post-LN encoder, masked LM + next sentence prediction", FEATURES, BertAdapter())
