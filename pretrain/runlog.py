"""What a run shows and keeps, written by rank 0: the progress bar and log lines, TensorBoard scalars,
metrics.jsonl and valid.jsonl (one row per step / evaluation), config.yaml and launch.json at the start,
summary.json at the end (`ptm report` draws the curves from them), failed.json where the run failed (`failed`)."""
from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import sys
import threading
import time

from pretrain.signals import PREEMPTED
from ptm.files import refused_write, write_bytes, write_json, write_text

FAILED = "failed.json"
LOGS = ("metrics.jsonl", "valid.jsonl")  # the per-step and per-evaluation rows
started: str | None = None  # the out_dir of the run this process has started (`RunLog.start`) and not finished


def log(msg: str) -> None:
    """A line of the run's log on stderr, from rank 0: flushed (a job's log file has it as it happens), above the
    progress bar where one is drawn (tqdm's `write` clears and redraws it)."""
    import torch.distributed as dist
    from tqdm import tqdm

    if not dist.is_initialized() or dist.get_rank() == 0:
        tqdm.write(f"pretrain: {msg}", file=sys.stderr)
        sys.stderr.flush()


class RunLog:
    """The log of the run in `out_dir`, kept by rank 0 (other ranks only make sure the directory exists). Its lines go
    to stderr with the rest of the log; stdout is left to the summary printed at the end."""

    def __init__(self, out_dir: str, rank0: bool, log):
        self.out_dir, self.rank0, self.log = out_dir, rank0, log
        self.bar = self.writer = None
        self.refused, self.total, self.first, self.t0 = set(), 0, 0, 0.0

    def start(self, config_yaml: str, launch: dict, total: int, done: int) -> None:
        """The resolved config, the launch (what `ptm plan --check` predicts for), the progress bar and TensorBoard.
        What the logs hold past step `done` (the checkpoint this run starts from; 0: none) was trained by a run that
        stopped before it could checkpoint, or by another run in this out_dir: it goes, as those steps are trained
        again (TensorBoard's purge_step; metrics.jsonl and valid.jsonl cut there), so no curve holds a step twice
        nor splices two runs."""
        try:
            os.makedirs(self.out_dir, exist_ok=True)
        except OSError as e:  # (what the checks cannot see: /proc, a read-only mount, another user's directory)
            if refused_write(e, self.out_dir):
                raise
            from pretrain.yaml_config import ConfigError

            raise ConfigError(f"out_dir={self.out_dir} cannot be created ({e.strerror}); set out_dir under a "
                              "directory this user may write") from None
        global started
        if not self.rank0:
            started = self.out_dir
            return
        write_text(os.path.join(self.out_dir, "config.yaml"), config_yaml)
        write_json(os.path.join(self.out_dir, "launch.json"), launch)
        started = self.out_dir  # (from here a failure is this run's; an earlier attempt's goes: this one runs)
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self.out_dir, FAILED))
        dropped = {name: _drop_past(os.path.join(self.out_dir, name), done) for name in LOGS}
        if any(dropped.values()):
            self.log(f"the logs' rows past step {done} ({', '.join(f'{n} of {k}' for k, n in dropped.items() if n)}), "
                     f"of {'a run that stopped before its checkpoint' if done else 'an earlier run'} in this out_dir, "
                     "are left out: those steps are trained again")
        from torch.utils.tensorboard import SummaryWriter
        from tqdm import tqdm

        self.writer = SummaryWriter(os.path.join(self.out_dir, "tensorboard"), purge_step=done + 1)
        _quiet_tensorboard_thread()
        self.total, self.first, self.t0 = total, done, time.monotonic()
        self.bar = tqdm(total=total, initial=done, desc="train", unit="step", file=sys.stderr, dynamic_ncols=True,
                        disable=None)

    def step(self, step: int, metrics: dict, show: bool, headline: tuple[str, ...]) -> None:
        """A training step's metrics: TensorBoard and metrics.jsonl, a log line when `show`, the bar's postfix."""
        if not self.rank0:
            return
        self._kept("metrics.jsonl", "train", step, metrics)
        if show:
            self.log(f"step {step}/{self.total}: " + fmt(metrics, tuple(metrics)) + self._times(step))
        self.bar.update(1)
        self.bar.set_postfix_str(fmt(metrics, (*headline, "lr", "samples_per_s", "tokens_per_s")),
                                 refresh=False)

    def left_out(self) -> None:
        """A step train.skip_steps leaves out: the bar moves on; no row; the time left is estimated from the steps
        trained."""
        self.first += 1
        if self.rank0:
            self.bar.update(1)

    def _times(self, step: int) -> str:
        """" elapsed=H:MM:SS eta=H:MM:SS" of this run's steps so far (what the bar shows, for a log without one)."""
        elapsed = time.monotonic() - self.t0
        left = elapsed / max(step - self.first, 1) * max(self.total - step, 0)
        return f" elapsed={_clock(elapsed)} eta={_clock(left)}"

    def evaluation(self, step: int, metrics: dict) -> None:
        """An evaluation's metrics (`valid_*`): TensorBoard, valid.jsonl and a log line (none without a held-out
        split, data.valid_fraction=0: an empty "step N:" line and {"step": N} rows before)."""
        if not metrics:
            return
        if self.rank0:
            self._kept("valid.jsonl", "valid", step, {k[6:]: v for k, v in metrics.items()}, metrics)
        self.log(f"step {step}: " + fmt(metrics, tuple(metrics)))

    def _kept(self, name: str, group: str, step: int, scalars: dict, row: dict | None = None) -> None:
        """A row of `name` and TensorBoard's `group/KEY` scalars. A write the system refuses (a full disk, a quota) is
        a warning, once each: the run goes on (its next checkpoint, which every rank agrees on, ends it if it cannot
        be written) rather than rank 0 alone ending in a traceback; the rows go on where there is space again (a row
        cut short goes), TensorBoard's curves end there (its writer keeps the error it failed with)."""
        path = os.path.join(self.out_dir, name)
        try:
            _append_jsonl(path, {"step": step, **(row or scalars)})
        except OSError as e:
            self._refused(e, path, "its logs missing steps until there is space")
        if self.writer is None:
            return
        try:
            for k, v in scalars.items():
                self.writer.add_scalar(f"{group}/{k}", v, step)
        except OSError as e:
            ending = f"TensorBoard's curves ending at step {step} ({name} goes on)"
            self._refused(e, os.path.join(self.out_dir, "tensorboard"), ending)
            self._drop_writer(ending)

    def _refused(self, e: OSError, path: str, then: str) -> None:
        line = refused_write(e, path)
        if line is None:
            raise e
        if line not in self.refused:
            self.refused.add(line)
            self.log(f"warning: {line}; the run goes on, {then}")

    def _drop_writer(self, then: str) -> None:
        """Close TensorBoard's writer; a write it could not make (its thread's error, raised again by each later call)
        is a warning (`then`, said once), never raised."""
        writer, self.writer = self.writer, None
        try:
            if writer is not None:
                writer.close()
        except OSError as e:
            self._refused(e, os.path.join(self.out_dir, "tensorboard"), then)

    def close(self) -> None:
        """The bar and TensorBoard's files closed; never raises a refused write (close runs while another error may be
        on its way out: that one is the run's)."""
        if self.bar is not None:
            self.bar.close()
        self.bar = None
        self._drop_writer("TensorBoard's last rows missing")

    def summary(self, summary: dict) -> None:
        global started
        started = None  # (finished: whatever fails after it is no failure of the run)
        if self.rank0:
            write_json(os.path.join(self.out_dir, "summary.json"), summary)


def failed(line: str | None, code: int, error: BaseException | None = None) -> None:
    """Keep why the run this process started failed in OUT_DIR/failed.json: `line` (what stderr ends with), the
    exception's type and the exit status. Nothing where no run started (a config refused before it leaves out_dir as it
    was), the line is another rank's to say (None), a rank said it first (the one whose own failure it is, before the
    others lose contact), or for a preemption (exit 75: checkpointed, the job requeues). Never raises."""
    if started is None or line is None or code == PREEMPTED:
        return
    path = os.path.join(started, FAILED)
    with contextlib.suppress(OSError):
        if not os.path.exists(path):
            write_json(path, {"error": line, "exception": type(error).__name__ if error else None, "exit": code})


def _quiet_tensorboard_thread() -> None:
    """TensorBoard's writer thread ends on a write the system refused with a traceback on stderr (threading's hook);
    the next scalar raises that error again, which `RunLog._kept` says in a warning line: that traceback goes."""
    hook = threading.excepthook
    if getattr(hook, "ptm", False):
        return

    def quiet(args):
        if not (type(args.thread).__module__.startswith("tensorboard.") and refused_write(args.exc_value, "")):
            hook(args)

    quiet.ptm = True
    threading.excepthook = quiet


def _clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


def _drop_past(path: str, step: int, keep: str | None = None, dry: bool = False) -> int:
    """Cut the jsonl log at `path` after its last row at or before `step`: the rows past it come last (each run appends
    in step order, and cuts those past its start), a last line cut short by a kill with them; what is cut is first
    written to `keep` where given (atomically; none where nothing is cut); `dry`: nothing cut. Read from its end, so a
    long log costs no more than its rows cut; the number of rows cut."""
    try:
        f = open(path, "r+b")
    except FileNotFoundError:
        return 0
    with f:
        cut = end = f.seek(0, os.SEEK_END)
        dropped = 0
        for start, line in _lines_backwards(f, end):
            if line.strip():
                if _step_of(line) <= step:
                    break
                dropped += 1
            cut = start
        if cut < end and not dry:
            if keep is not None:
                f.seek(cut)
                write_bytes(keep, f.read())
            f.truncate(cut)
    return dropped


def set_aside_past(out_dir: str, step: int, keep_dir: str | None) -> dict[str, int]:
    """Move the rows of a run's logs (metrics.jsonl, valid.jsonl) past `step` into files of the same names in
    `keep_dir` (None: only count them); {log: rows}."""
    return {name: _drop_past(os.path.join(out_dir, name), step, keep_dir and os.path.join(keep_dir, name),
                             dry=keep_dir is None) for name in LOGS}


def _lines_backwards(f, end: int, block: int = 1 << 16):
    """(offset, line) of each line of binary file `f` (of `end` bytes), the last first."""
    pos, rest = end, b""
    while pos > 0:
        size = min(block, pos)
        pos -= size
        f.seek(pos)
        parts = (f.read(size) + rest).split(b"\n")
        rest, offset, found = parts[0], pos + len(parts[0]) + 1, []
        for part in parts[1:]:
            found.append((offset, part))
            offset += len(part) + 1
        yield from reversed(found)
    yield 0, rest


def _step_of(line: bytes) -> float:
    """A log row's step; a line that is no row (cut short by a kill) counts as past any step."""
    try:
        return float(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return math.inf


def _append_jsonl(path: str, row: dict) -> None:
    """A row at the end of the log at `path`, whole or not at all (a write refused part way is cut off again, so the
    next row does not join a row cut short)."""
    data = memoryview((json.dumps(row) + "\n").encode())
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            while data:
                data = data[os.write(fd, data):]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, end)
            raise
    finally:
        os.close(fd)


def fmt(metrics: dict, keys: tuple) -> str:
    """`k=v` for each of `keys` in `metrics`: 4 significant digits, a number from 10,000 up whole with separators
    (tokens_per_s=14,390, not 1.439e+04)."""
    return " ".join(f"{k}={metrics[k]:,.0f}" if abs(metrics[k]) >= 1e4 else f"{k}={metrics[k]:.4g}"
                    for k in keys if k in metrics)
