"""ERNIE 2.0 continual multi-task pretraining (Sun et al. 2020; samples: pretrain/data/multitask.py, tasks:
pretrain/data/ernie_tasks.py). The `ernie` config section schedules the tasks in stages; one term per task of the
current stage: `mlm` for knowledge masking (on the model's MLM head), the task's name for the others, each on a
head of its own (`heads`). The same section's stages schedule ERNIE 1.0's knowledge-masking levels for the masked-LM
objectives (`masked_lm.Masked`)."""
from __future__ import annotations

from dataclasses import dataclass

from pretrain.data.ernie_tasks import SEQUENCE_TASKS, TASK_SPECS, TASKS, TOKEN_TASKS, USER_LABELED
from pretrain.objectives.base import Section
from pretrain.objectives.masked_lm import Masked
from pretrain.data.masking import KNOWLEDGE_LEVELS as LEVELS
from pretrain.schema import opt

ORDER = 30
KNOWLEDGE_LEVELS = tuple(LEVELS)


@dataclass
class ErnieStage:
    steps: int = opt(0, "optimizer steps of this stage")
    tasks: dict[str, float] = opt({}, "task name -> sampling weight (data.objective=ernie)")
    knowledge_level: str = opt("entity", "knowledge-masking units in this stage: " + " | ".join(KNOWLEDGE_LEVELS)
                               + " (ERNIE 1.0's basic, phrase and entity stages)", choices=KNOWLEDGE_LEVELS)


@dataclass
class ErnieConfig:
    stages: list[ErnieStage] = opt([], "ERNIE 2.0 continual multi-task schedule, run in order: [{steps, tasks: {task: "
                                       "weight}}]; tasks: " + ", ".join(TASKS) + "; or ERNIE 1.0's knowledge-masking "
                                       "stages [{steps, knowledge_level}]")
    task_data: dict[str, str] = opt({}, "labelled datasets of " + " and ".join(USER_LABELED) + ": {task: path}")

    def stage_index(self, step: int) -> int:
        """Index of the stage that optimizer step `step` (from 0) belongs to; the last one after the schedule
        ends; 0 without stages."""
        end = 0
        for i, stage in enumerate(self.stages):
            end += stage.steps
            if step < end:
                return i
        return max(len(self.stages) - 1, 0)

    def stage_at(self, step: int) -> ErnieStage:
        """The stage that optimizer step `step` (from 0) belongs to."""
        return self.stages[self.stage_index(step)]


def check_section(cfg, need, objective) -> None:
    """The `ernie` section where it applies: stages only where they schedule something, adding up to train.steps;
    labelled data only for the tasks that take it."""
    e = cfg.ernie
    scheduled = bool(objective.phases())
    need(not e.stages or scheduled,
         f"ernie.stages is set but data.objective={cfg.data.objective} and data.masking={cfg.data.masking}; set "
         "data.objective=ernie (ERNIE 2.0 tasks) or data.masking=knowledge (ERNIE 1.0 stages), or remove it")
    total = sum(s.steps for s in e.stages)
    need(not e.stages or total == cfg.train.steps,
         f"ernie.stages add up to {total} steps but train.steps={cfg.train.steps}; make them equal (one stage's: "
         "--set ernie.stages.0.steps=N)")
    for task in e.task_data:
        need(task in USER_LABELED, f"ernie.task_data.{task}: only {' and '.join(USER_LABELED)} take a dataset; remove it")


class Ernie(Masked):
    name = "ernie"
    help = "ERNIE 2.0 multi-task continual pretraining, tasks from ernie.stages"
    pairs = True
    one_lm_head = False
    strategy = "knowledge"
    keys_read = ("data.mask_prob", "data.max_predictions_per_seq")  # knowledge masking always, on pairs of its own
    # (pretrain/data/multitask.py: no short sequences)
    section = Section("ernie", ErnieConfig, check_section, owned=False)
    headline = ("mlm_loss", "mlm_acc")

    def check(self, cfg, need) -> None:
        super().check(cfg, need)
        e = cfg.ernie
        need(cfg.model.arch == "ernie", "data.objective=ernie needs model.arch=ernie; set model.arch=ernie")
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

    def phases(self) -> list:
        return self.cfg.ernie.stages

    def describe(self, phase) -> str:
        return f"tasks {phase.tasks}"

    def idle(self, phase) -> tuple[str, ...]:
        """The heads of tasks outside the stage, the MLM head without knowledge masking, the pooler without a sequence
        task, and the NSP head (kept for the export, trained by no task)."""
        tasks = _tasks(phase)
        return (*(f"tasks.token.{t}" for t in TOKEN_TASKS if t not in tasks),
                *(f"tasks.sequence.{t}" for t in SEQUENCE_TASKS if t not in tasks),
                *(() if "knowledge_masking" in tasks else ("mlm",)),
                *(() if any(t in SEQUENCE_TASKS for t in tasks) else ("pooler",)), "nsp")

    def source(self, path, corpus, docs, phase, cache_dir=None):
        from pretrain.data.multitask import ErnieDataset

        if phase is None or not phase.tasks:
            raise ValueError("data.objective=ernie needs the current stage's tasks (ernie.stages)")
        return ErnieDataset(path, self.cfg.data.seq_len, self.masker(corpus, phase), tasks=phase.tasks,
                            task_data=self.cfg.ernie.task_data, seed=self.cfg.seed, docs=docs, cache_dir=cache_dir)

    def heads(self, cfg, frozen: bool = True) -> dict:
        """`tasks`: a classifier per token task (`tasks.token`) and per sequence task (`tasks.sequence`, on the pooled
        [CLS] state; the labelled tasks with their datasets' classes). ptm-only: the Hugging Face export keeps the MLM
        and NSP heads."""
        from torch import nn

        h = cfg.model.hidden_size
        tasks = nn.Module()
        tasks.token = nn.ModuleDict({t: nn.Linear(h, n) for t, n in _classes(cfg, TOKEN_TASKS).items()})
        tasks.sequence = nn.ModuleDict({t: nn.Linear(h, n) for t, n in _classes(cfg, SEQUENCE_TASKS).items()})
        for m in tasks.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=cfg.model.init_std)
                nn.init.zeros_(m.bias)
        return {"tasks": tasks}

    def head_parameters(self, cfg) -> int:
        h = cfg.model.hidden_size
        return sum((h + 1) * n for kind in (TOKEN_TASKS, SEQUENCE_TASKS) for n in _classes(cfg, kind).values())

    def select(self, batch, phase=None):
        tasks = _tasks(phase)
        out = {"mlm": batch["labels"] != -100} if "knowledge_masking" in tasks else {}
        token_task = batch["token_task"] if "token_task" in batch else batch["task"][:, None]  # packed or padded
        for name in TOKEN_TASKS:
            if name in tasks:
                out[name] = (token_task == TASKS.index(name)) & (batch["token_labels"] != -100)
        for name in SEQUENCE_TASKS:
            if name in tasks:
                out[name] = batch["task"] == TASKS.index(name)
        return out

    def compute(self, model, batch, phase=None, fused=False):
        """Every head of the stage runs on every rank, on no rows when the batch has none of its samples, so
        that ranks make the same ZeRO-3 gathers and gradient reductions whatever their data."""
        from pretrain.losses import class_term, pick, token_term

        where = self.where(batch, phase)
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


def _classes(cfg, tasks: tuple[str, ...]) -> dict[str, int]:
    """{task: classes} of the heads of `tasks`: every task's with a fixed count, the labelled tasks' from the datasets
    of ernie.task_data."""
    import json
    import os

    labelled = {}
    for task, path in cfg.ernie.task_data.items():
        with open(os.path.join(path, "manifest.json")) as f:
            labelled[task] = json.load(f)["num_labels"]
    return {t: TASK_SPECS[t].classes or labelled[t] for t in tasks if TASK_SPECS[t].classes or t in labelled}


def _tasks(phase) -> tuple[str, ...]:
    """The task names of a stage (the phase; None: no task)."""
    return tuple(phase.tasks) if phase is not None else ()


OBJECTIVES = (Ernie(),)
