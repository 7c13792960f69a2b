"""ERNIE 2.0 continual multi-task pretraining (Sun et al. 2020; samples: pretrain/data/ernie.py, extra heads:
pretrain/models/ernie_heads.py). `ernie.stages` schedules the tasks; one term per task of the current stage:
`mlm` for knowledge masking (on the model's MLM head), the task's name for the others."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from pretrain.objectives import Objective


@dataclass(frozen=True)
class Task:
    group: int  # the task-type embedding id: 0 word-aware, 1 structure-aware, 2 semantic-aware
    kind: str  # mlm (masked tokens) | token (a class per word) | sequence (a class per sample, on [CLS])
    classes: int  # 0: from the labelled dataset (ernie.task_data)
    help: str


PERMUTATIONS = [p for k in (1, 2, 3) for p in itertools.permutations(range(k))]  # sentence_reordering classes
TASK_SPECS = {
    "knowledge_masking": Task(0, "mlm", 0, "masked LM with phrase and entity masking (word-aware)"),
    "capitalization": Task(0, "token", 2, "predict whether a word is capitalised (word-aware)"),
    "token_document_relation": Task(0, "token", 2, "predict whether a token also occurs in other segments of its "
                                                   "document (word-aware)"),
    "sentence_reordering": Task(1, "sequence", len(PERMUTATIONS), "restore the order of shuffled segments "
                                                                  "(structure-aware)"),
    "sentence_distance": Task(1, "sequence", 3, "adjacent sentences, same document or another document "
                                                "(structure-aware)"),
    "discourse_relation": Task(2, "sequence", 0, "relation between two sentences, from labelled data "
                                                 "(semantic-aware)"),
    "ir_relevance": Task(2, "sequence", 0, "query-title relevance, from labelled data (semantic-aware)"),
}
TASKS = tuple(TASK_SPECS)  # a sample's `task` field is the index here
TOKEN_TASKS = tuple(t for t, s in TASK_SPECS.items() if s.kind == "token")
SEQUENCE_TASKS = tuple(t for t, s in TASK_SPECS.items() if s.kind == "sequence")
USER_LABELED = tuple(t for t in SEQUENCE_TASKS if not TASK_SPECS[t].classes)  # these need ernie.task_data


class Ernie(Objective):
    name = "ernie"
    help = "ERNIE 2.0 multi-task continual pretraining, tasks from ernie.stages"
    pairs = True
    one_lm_head = False

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        need(cfg.model.arch == "ernie", "data.objective=ernie needs model.arch=ernie; set model.arch=ernie")

    def check_stages(self, cfg, need) -> None:
        e = cfg.ernie
        need(e.stages, "data.objective=ernie needs ernie.stages; give a list of {steps, tasks: {task: weight}}")
        for i, stage in enumerate(e.stages):
            where = f"ernie.stages[{i}]"
            need(stage.steps > 0, f"{where}.steps={stage.steps} must be positive; give the stage its steps")
            need(stage.tasks, f"{where}.tasks is empty; give at least one of {', '.join(TASKS)}")
            for task, weight in stage.tasks.items():
                need(task in TASKS, f"{where}.tasks: unknown task '{task}'; valid tasks: {', '.join(TASKS)}")
                need(weight > 0, f"{where}.tasks.{task}={weight}: sampling weights must be positive; "
                                 f"raise it or drop the task")
                need(task not in USER_LABELED or e.task_data.get(task),
                     f"{where}.tasks: {task} needs labelled data; set ernie.task_data.{task}=PATH")
            dropped = [t for t in (e.stages[i - 1].tasks if i else {}) if t not in stage.tasks]
            need(not dropped, f"{where}.tasks drops {', '.join(dropped)} of the stage before; ERNIE 2.0's continual "
                              f"multi-task learning keeps training earlier tasks: add them (a small weight will do)")

    def source(self, data, path, corpus, docs, *, seed, cache_dir, knowledge_level, tasks, task_data):
        from pretrain.data.ernie import ErnieDataset

        if not tasks:
            raise ValueError("data.objective=ernie needs the current stage's tasks (ernie.stages)")
        masker = self.masker(data, corpus, "knowledge", knowledge_level)
        return ErnieDataset(path, data.seq_len, masker, tasks=tasks, task_data=task_data, seed=seed, docs=docs,
                            cache_dir=cache_dir)

    def add_heads(self, model, cfg) -> None:
        from data_prep.dataset import Corpus
        from pretrain.models.ernie_heads import ErnieTaskHeads

        labelled = {task: Corpus(path).manifest["num_labels"] for task, path in cfg.ernie.task_data.items()}
        model.tasks = ErnieTaskHeads(cfg.model.hidden_size, cfg.model.init_std, labelled)

    def select(self, batch, tasks=()):
        out = {"mlm": batch["labels"] != -100} if "knowledge_masking" in tasks else {}
        token_task = batch["token_task"] if "token_task" in batch else batch["task"][:, None]  # packed or padded
        for name in TOKEN_TASKS:
            if name in tasks:
                out[name] = (token_task == TASKS.index(name)) & (batch["token_labels"] != -100)
        for name in SEQUENCE_TASKS:
            if name in tasks:
                out[name] = batch["task"] == TASKS.index(name)
        return out

    def compute(self, model, batch, tasks=()):
        """Every head of the stage runs on every rank, on no rows when the batch has none of its samples, so
        that ranks make the same ZeRO-3 gathers and gradient reductions whatever their data."""
        from pretrain.losses import class_term, pick, token_term

        where = self.where(batch, tasks)
        h = model(batch["input_ids"], batch.get("attention_mask"), batch["token_type_ids"], batch["task_type_ids"],
                  hidden=True, position_ids=batch.get("position_ids"), sample_index=batch.get("sample_index"))["hidden"]
        terms = {}
        if "mlm" in where:
            terms["mlm"] = token_term(model.lm_logits(pick(h, where["mlm"], 2)), pick(batch["labels"], where["mlm"], 2))
        for name, head in model.tasks.token.items():
            if name in where:
                terms[name] = class_term(head(pick(h, where[name], 2)), pick(batch["token_labels"], where[name], 2))
        pooled = model.pooled(h, batch.get("cls_index"))
        for name, head in model.tasks.sequence.items():
            if name in where:
                terms[name] = class_term(head(pick(pooled, where[name], 1)), pick(batch["seq_label"], where[name], 1))
        return terms
