"""`ptm report RUN_DIR`: a run's curves as one PNG (training and validation losses, learning rate, throughput,
gradient norm) from its metrics.jsonl and valid.jsonl, and its summary on stdout."""
from __future__ import annotations

import json
import os

PANELS = (  # (title, keys from the training rows, validation too)
    ("loss", ("loss", "mlm_loss", "nsp_loss", "sop_loss", "lm_loss"), True),
    ("learning rate", ("lr",), False),
    ("throughput (tokens/s)", ("tokens_per_s",), False),
    ("gradient norm", ("grad_norm",), False),
)


class ReportError(ValueError):
    """A log or output that cannot be used; the message names it and the fix."""


def log_rows(path: str) -> list[dict]:
    """A jsonl log, the last row of each step winning (a resumed run logs the steps after its checkpoint again); a
    last line cut short (the run killed while writing it) is left out."""
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


def report(run_dir: str, out: str | None = None) -> str:
    """Plot the run's curves into `out` (default RUN_DIR/report.png); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, valid = log_rows(os.path.join(run_dir, "metrics.jsonl")), log_rows(os.path.join(run_dir, "valid.jsonl"))
    if not train:
        raise FileNotFoundError(f"{run_dir}/metrics.jsonl is missing or empty; pass a run's out_dir")
    out = out or os.path.join(run_dir, "report.png")
    if not os.path.isdir(os.path.dirname(os.path.abspath(out))):
        raise ReportError(f"--out {out}: its directory does not exist; create it or write elsewhere")
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    for ax, (title, keys, with_valid) in zip(axes.flat, PANELS):
        for key in keys:
            points = [(r["step"], r[key]) for r in train if key in r]
            if points:
                ax.plot(*zip(*points), label=key, linewidth=1)
            points = [(r["step"], r[f"valid_{key}"]) for r in valid if f"valid_{key}" in r] if with_valid else []
            if points:
                ax.plot(*zip(*points), "o-", label=f"valid {key}", markersize=3)
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(os.path.abspath(run_dir), fontsize=9)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
