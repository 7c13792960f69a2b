"""ERNIE 1.0 / 2.0 (Sun et al. 2019, 2020): BERT's model, plus ERNIE 2.0's task-type embeddings; knowledge masking
and continual multi-task pretraining (pretrain/objectives/ernie.py). Exports as ErnieForPreTraining."""
from __future__ import annotations

from pretrain.families import bert
from pretrain.families.base import Family, hf_common

ORDER = 30


class ErnieAdapter(bert.BertAdapter):
    hf_class = "ErnieForPreTraining"
    masked_lm_class = "ErnieForMaskedLM"
    model_type = "ernie"
    prefix = "ernie."
    keys = {**bert.EMBEDDINGS, "embeddings.task_type.weight": "{p}embeddings.task_type_embeddings.weight", **bert.HEADS}
    computes = {k: v for k, v in bert.COMPUTES.items() if k != "task_type_vocab_size"}

    def hf_config(self, cfg, special):
        import transformers

        return transformers.ErnieConfig(use_task_id=cfg.task_type_vocab_size > 0,
                                        task_type_vocab_size=max(cfg.task_type_vocab_size, 1),
                                        **hf_common(cfg, special, self.models(cfg)[0][2]))

    def model_config(self, hf):
        task = hf.task_type_vocab_size if getattr(hf, "use_task_id", False) else 0
        return dict(super().model_config(hf), arch="ernie", task_type_vocab_size=task)


def check(cfg, need, objective) -> None:
    m = cfg.model
    need(m.task_type_vocab_size == 0 or m.arch == "ernie",
         f"model.task_type_vocab_size={m.task_type_vocab_size} needs model.arch=ernie; set it to 0")


FAMILY = Family("ernie", "ERNIE 1.0/2.0: BERT's model with knowledge masking and task-type embeddings",
                dict(bert.FEATURES), ErnieAdapter(), check)
