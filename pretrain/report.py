"""`ptm report RUN_DIR`: a run's curves as one PNG from its metrics.jsonl and valid.jsonl (training and validation:
the total loss, every loss term the rows hold, the accuracies; learning rate, throughput, gradient norm), and its
summary on stdout. No objective is named here: a panel takes the rows' metrics by the form of their names (`*_loss`,
`*_acc`), whatever objective logged them. A run in stages (rows with a `stage`: ERNIE 2.0's tasks, TinyBERT's
distillation steps) gets a vertical line at each change of stage, and no curve is joined across one (its loss
terms change there by design)."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re

TOTAL = "loss"
VALID = "valid_"  # the prefix of a metric's name in valid.jsonl
STAGE = "stage"
PANELS = (  # (title, which metric names (without VALID) it draws, with their validation curves: the model's measures,
    # whose curves break where a stage begins, log scale allowed)
    ("loss", lambda k: k == TOTAL, True, True),
    ("loss terms", lambda k: k.endswith("_loss"), True, True),
    ("accuracy", lambda k: re.search(r"_(acc|auc)(_|$)", k) is not None, True, False),
    ("learning rate", lambda k: k == "lr", False, False),
    ("throughput (tokens/s)", lambda k: k == "tokens_per_s", False, False),
    ("gradient norm", lambda k: k == "grad_norm", False, False),
)
FEW = 30  # a curve of at most this many points marks them (a 1-step run's single point is no line)
LOG_SPAN = 100  # a panel whose values are positive and span more than this factor gets a log scale


def reference(key: str) -> bool:
    """A metric the model is measured against rather than one it trains: a baseline that always answers the most
    frequent token (`*unigram*`) or a frozen teacher's (`teacher_*`); drawn dashed."""
    return "unigram" in key or key.startswith("teacher_")


@dataclasses.dataclass
class Curve:
    key: str  # the metric's name in metrics.jsonl (VALID + key in valid.jsonl)
    valid: bool
    segments: list  # [[(step, value), ...], ...]: one per stretch of steps in one stage

    @property
    def label(self) -> str:
        return f"valid {self.key}" if self.valid else self.key

    @property
    def points(self) -> int:
        return sum(len(s) for s in self.segments)


class ReportError(ValueError):
    """A log or output that cannot be used; the message names it and the fix."""


def log_rows(path: str) -> list[dict]:
    """A jsonl log, the last row of each step winning (a resume cuts the rows logged past its checkpoint: a log written
    before it did holds those steps twice); a last line cut short (the run killed while writing it) is left out."""
    if not os.path.isfile(path):
        return []
    by_step = {}
    with open(path, errors="replace") as f:
        lines = f.read().split("\n")
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line) if line.strip() else None
            if row is not None:
                by_step[row["step"]] = row
        except (ValueError, KeyError, TypeError):
            if number == len(lines):  # after the last newline: a row being written
                break
            raise ReportError(f"{path}:{number} is not a ptm log row (JSON with a step); pass a run's out_dir, or "
                              "remove that line if the file was edited") from None
    return [by_step[s] for s in sorted(by_step)]


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _curve(rows: list[dict], key: str, valid: bool, staged: bool = True) -> Curve:
    """The points of `key` in `rows`; where `staged`, a new segment wherever the stage changes (a loss's terms change
    there by design; the learning rate, the throughput, the gradient norm go on)."""
    name, stage_name = (VALID + key, VALID + STAGE) if valid else (key, STAGE)
    segments, last = [], None
    for r in rows:
        if _number(r.get(name)):
            if not segments or staged and r.get(stage_name) != last:
                segments.append([])
            segments[-1].append((r["step"], r[name]))
            last = r.get(stage_name)
    return Curve(key, valid, segments)


def _names(rows: list[dict], prefix: str = "") -> list[str]:
    """The metric names in `rows` (without `prefix`, those that have it), in the order they first come."""
    return list(dict.fromkeys(k[len(prefix):] for r in rows for k in r if k.startswith(prefix)))


def panels(train: list[dict], valid: list[dict]) -> list[tuple[str, list[Curve], bool]]:
    """[(title, curves, log scale allowed)] in PANELS' order: each metric its panel takes, its training curve and
    then its validation one (where they have points)."""
    names = [k for k in dict.fromkeys(_names(train) + _names(valid, VALID)) if k not in ("step", STAGE)]
    out = []
    for title, takes, with_valid, log in PANELS:
        curves = []
        for key in filter(takes, names):
            drawn = [_curve(train, key, False, with_valid)] + ([_curve(valid, key, True)] if with_valid else [])
            curves += [c for c in drawn if c.points]
        out.append((title, curves, log))
    return out


def stage_changes(train: list[dict], valid: list[dict]) -> list[tuple[float, object]]:
    """[(x, stage)]: where each new stage begins (halfway between the last row of one stage and the first of the
    next), from the training rows' `stage` (the validation rows' where only they have one)."""
    stages = {r["step"]: r[VALID + STAGE] for r in valid if VALID + STAGE in r}
    stages.update({r["step"]: r[STAGE] for r in train if STAGE in r})
    ordered = sorted(stages.items())
    return [((a + b) / 2, stage) for (a, before), (b, stage) in zip(ordered, ordered[1:]) if stage != before]


def figure(train: list[dict], valid: list[dict], title: str = ""):
    """The report's matplotlib figure of `train` (metrics.jsonl's rows) and `valid` (valid.jsonl's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    steps = [r["step"] for r in train + valid]
    pad = max(0.5, (max(steps) - min(steps)) * 0.03)
    changes = stage_changes(train, valid)
    fig, axes = plt.subplots(3, 2, figsize=(11, 10), constrained_layout=True)
    for ax, (name, curves, log) in zip(axes.flat, panels(train, valid)):
        colors = {}
        for curve in curves:
            style = {"color": colors.setdefault(curve.key, f"C{len(colors) % 10}"), "linewidth": 1,
                     "linestyle": "--" if reference(curve.key) else "-"}
            if curve.valid:
                style.update(marker="s", markersize=3.5, alpha=0.8)
            elif curve.points <= FEW:
                style.update(marker="o", markersize=3)
            for i, segment in enumerate(curve.segments):
                ax.plot(*zip(*segment), label=curve.label if i == 0 else "_nolegend_", **style)
        values = [y for c in curves for s in c.segments for _, y in s if math.isfinite(y)]
        if log and values and min(values) > 0 and max(values) > LOG_SPAN * min(values):
            ax.set_yscale("log")
        for x, stage in changes:
            ax.axvline(x, color="0.55", linestyle=":", linewidth=1)
            ax.text(x, 1, f" {STAGE} {stage}", transform=ax.get_xaxis_transform(), fontsize=7, color="0.4",
                    va="top")
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_xlim(min(steps) - pad, max(steps) + pad)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # steps: whole numbers
        if curves:
            ax.legend(fontsize=7, ncol=2 if len(curves) > 8 else 1)
        else:
            ax.text(0.5, 0.5, "not in the logs", transform=ax.transAxes, ha="center", color="0.5")
            ax.set_yticks([])
    fig.suptitle(title, fontsize=9)
    return fig


def report(run_dir: str, out: str | None = None) -> str:
    """Plot the run's curves into `out` (default RUN_DIR/report.png); returns the path."""
    train, valid = log_rows(os.path.join(run_dir, "metrics.jsonl")), log_rows(os.path.join(run_dir, "valid.jsonl"))
    if not train:
        raise FileNotFoundError(f"{run_dir}/metrics.jsonl is missing or empty; pass a run's out_dir")
    out = out or os.path.join(run_dir, "report.png")
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise ReportError(f"--out {out}: its directory does not exist; create it or write elsewhere")
    fig = figure(train, valid, os.path.abspath(run_dir))
    import matplotlib.pyplot as plt  # (after figure chose the backend)

    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
