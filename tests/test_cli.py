"""The command line: `ptm` dispatch, --help that explains every option and says its default, and `ptm report`'s
curves."""
import argparse
import importlib
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from data_prep.cli import size_arg


@pytest.mark.parametrize("package", ["data_prep", "pretrain", "launchers", "checkpoints_tools", "downstream"])
def test_every_option_has_help(package, monkeypatch):
    """Every option has a help, and one with a default says it ("(default 32000)", or a default said in words), as
    downstream's always did; one without a default (None), an empty one and a flag's True/False say none."""
    monkeypatch.setenv("COLUMNS", "2000")  # one line per option
    ap = importlib.import_module(f"{package}.cli").parser()
    subs = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subs.choices.items():
        shown = " ".join(sub.format_help().split())
        for action in sub._actions:
            where = f"{name} {action.option_strings or action.dest}"
            assert action.help and len(action.help) > 10, where
            said = "default" in action.help
            if action.option_strings and action.nargs != 0 and action.default not in (None, "", []):
                assert said, f"{where}: its default {action.default!r} is not in its help"
            elif action.option_strings and action.nargs != 0 and action.help is not argparse.SUPPRESS:
                assert "(default None)" not in action.help and "default []" not in action.help, where
        assert "(default None" not in shown and "(default False" not in shown and "(default True" not in shown
    if package == "data_prep":
        build = " ".join(subs.choices["build"].format_help().split())
        assert "pieces in the trained tokenizer (default 32000)" in build
        assert "reserved [unusedN] tokens after the specials (sentencepiece; default 100)" in build
        assert "(default 256MB)" in build and "(default 268435456)" not in build  # a default said by hand stays


@pytest.mark.parametrize("columns", [100, 120, 2])
def test_train_help_fits_the_terminal(columns, monkeypatch):
    """`ptm train --help`'s key table (every config key, its type, default and description) fits the terminal's width
    as argparse's own help does: descriptions wrapped under their column, a default too long for its column (unilm.mix)
    said in full in its description; a terminal too narrow for anything (COLUMNS=2, where every command, which builds
    the table, failed) gets it 40 columns wide."""
    from pretrain import schema
    from pretrain.config import Config

    monkeypatch.setenv("COLUMNS", str(columns))
    ap = importlib.import_module("pretrain.cli").parser()
    text = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction)).choices["train"].format_help()
    assert max(map(len, text.splitlines())) <= max(columns - 2, 40) or columns == 2, max(text.splitlines(), key=len)
    flat = " ".join(text.split())
    for key, _, default, f in schema.leaves(Config):
        assert f" {key} " in flat and " ".join(f.metadata["help"].split()) in flat, key
        assert json.dumps(default) in flat, key


def test_ptm_dispatches_to_data_prep():
    ptm = os.path.join(os.path.dirname(os.sys.executable), "ptm")
    out = subprocess.run([ptm, "prep", "build", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "--shard-size" in out.stdout and "usage: ptm prep build" in out.stdout
    top = subprocess.run([ptm, "--help"], capture_output=True, text=True)
    assert all(c in top.stdout for c in ("prep", "train", "convert", "launch"))
    launch = subprocess.run([ptm, "launch", "env"], capture_output=True, text=True, cwd=ROOT)
    assert launch.returncode == 0 and '"launcher": null' in launch.stdout
    bad = subprocess.run([ptm, "frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 2 and "ptm: error: unknown command 'frobnicate'" in bad.stderr
    assert "--version" in top.stdout
    module = subprocess.run([sys.executable, "-m", "ptm", "prep", "verify", "--help"], capture_output=True, text=True,
                            cwd=ROOT)  # the package runs as `python -m ptm`, as the others do
    assert module.returncode == 0 and "usage: ptm prep verify" in module.stdout, module.stderr


def test_size_arguments():
    assert size_arg("256MB") == 256 << 20 and size_arg("64KiB") == 64 << 10 and size_arg("1000") == 1000
    proc = run_cli("data_prep", "build", "x.txt", "--out", "o", "--shard-size", "lots", check=False)
    assert proc.returncode == 2 and "is not a size" in proc.stderr


def test_convert_help_names_every_family_it_converts(monkeypatch):
    """`checkpoints_tools --help` names every registered family with a Hugging Face class, to-hf each one's class,
    from-hf each one's model_type, and ELMo's own converters; --help is answered before torch is imported."""
    from checkpoints_tools import cli
    from pretrain import families

    monkeypatch.setenv("COLUMNS", "2000")  # argparse wraps at hyphens: to-elmo on one line
    ap = cli.parser()
    subs = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction)).choices
    top, to_hf, from_hf = (" ".join(p.format_help().split()) for p in (ap, subs["to-hf"], subs["from-hf"]))
    exported = [f for f in families.REGISTRY.values() if f.adapter]
    # every family exports to its HF class but ELMo (bilm-tf's files); one more without an HF class is named here
    assert len(exported) >= 12 and {f.name for f in families.REGISTRY.values() if not f.adapter} == {"elmo"}
    for f in exported:
        assert f.help.split(":")[0] in top and f.adapter.hf_class in to_hf and f.adapter.model_type in from_hf, f.name
    assert "ELMo" in top and "to-elmo" in top and "to-elmo" in to_hf
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "checkpoints_tools", "--help"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "import time:" in proc.stderr
    assert not re.search(r"\|\s+torch$", proc.stderr, re.M)


def test_every_adapter_names_a_tokenizer_template_that_export_writes():
    """The special-token template each adapter names is one `export_tokenizer` knows, and base.Adapter's comment lists
    them all; an unknown one is refused. The tokenizer class each names is transformers' for its model type (NEZHA's,
    which transformers lacks: BERT's)."""
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    from checkpoints_tools.hf import TEMPLATES, export_tokenizer
    from pretrain import families
    from pretrain.families import base

    assert {f.adapter.tokenizer for f in families.REGISTRY.values() if f.adapter} == set(TEMPLATES)
    assert {f.name: f.adapter.tokenizer_class for f in families.REGISTRY.values() if f.adapter} == {
        f.name: TOKENIZER_MAPPING_NAMES.get(f.adapter.model_type, "BertTokenizer")
        for f in families.REGISTRY.values() if f.adapter}
    line = next(line for line in open(base.__file__) if line.strip().startswith("tokenizer = "))
    assert all(f" {t}" in line for t in TEMPLATES)
    with pytest.raises(ValueError, match="tokenizer template 'gpt' is not one of"):
        export_tokenizer("unused", "unused", "gpt", False, 8)


def test_readme_opening_names_every_family():
    """README's first paragraph names every registered family (its help's name, e.g. "ELECTRA")."""
    from pretrain import families

    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    opening = " ".join(text.split("\n\n")[1].split())
    for f in families.REGISTRY.values():
        assert f.help.split(":")[0].split(" ")[0] in opening, f.name


def test_a_reader_that_stops_reading_ends_a_command_quietly(train_data):
    """`python -m data_prep inspect DATA | head -1` (or `ptm report RUN | head`): status 141, as SIGPIPE ends a shell
    tool, and nothing on stderr (it was a BrokenPipeError traceback)."""
    proc = subprocess.run(f"{sys.executable} -m data_prep inspect {train_data} --samples 2000 | head -1 >/dev/null; "
                          "exit ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr[-2000:]


def _report_figure(run_dir, train, valid, monkeypatch):
    """The figure `ptm report` saves for these metrics.jsonl and valid.jsonl rows."""
    from matplotlib.figure import Figure

    from pretrain.report import report

    os.makedirs(run_dir)
    for name, rows in (("metrics.jsonl", train), ("valid.jsonl", valid)):
        with open(os.path.join(run_dir, name), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *_, **__: saved.append(fig))
    report(str(run_dir))
    return saved[0]


def _curves(ax) -> dict:
    """{label: [(x, y), ...] of each of its lines} of the curves drawn in `ax` (a curve in pieces: each piece)."""
    pieces, label = {}, None
    for line in ax.get_lines():
        if line.get_label().startswith("_child") or len(set(line.get_xdata())) == 1 and len(line.get_xdata()) == 2:
            continue  # (a vertical line)
        label = line.get_label() if not line.get_label().startswith("_") else label
        pieces.setdefault(label, []).append(list(zip(line.get_xdata(), line.get_ydata())))
    return pieces


def test_report_draws_every_loss_term_and_the_stages(tmp_path, monkeypatch):
    """ELECTRA's rows: its rtd_loss (50 times it in `loss`) and the accuracies are drawn, training and validation, the
    terms apart from the total. TinyBERT's two stages: a vertical line at the change on every panel, and no curve
    joined across it (each stage's loss terms differ; the total jumps there by design), but the learning rate's,
    throughput's and gradient norm's."""
    electra = [{"step": s, "mlm_loss": 9 - s / 100, "mlm_acc": s / 100, "rtd_loss": 0.7 - s / 1000, "rtd_auc": 0.5,
                "rtd_original_acc": 0.9, "loss": 44 - s / 10, "lr": 1e-3, "tokens_per_s": 1e3, "grad_norm": 30.0}
               for s in range(1, 41)]
    valid = [{"step": s, "valid_mlm_loss": 8.5, "valid_mlm_acc": 0.1, "valid_mlm_unigram_acc": 0.05,
              "valid_rtd_loss": 0.6, "valid_rtd_auc": 0.6, "valid_loss": 38.5} for s in (20, 40)]
    fig = _report_figure(tmp_path / "electra", electra, valid, monkeypatch)
    drawn = [set(_curves(ax)) for ax in fig.axes]
    assert {"loss", "valid loss"} in drawn
    assert {"mlm_loss", "valid mlm_loss", "rtd_loss", "valid rtd_loss"} in drawn
    assert {"mlm_acc", "valid mlm_acc", "rtd_auc", "valid rtd_auc", "rtd_original_acc", "valid mlm_unigram_acc"} \
        in drawn
    assert {"lr"} in drawn and {"tokens_per_s"} in drawn and {"grad_norm"} in drawn
    common = {"lr": 1e-3, "tokens_per_s": 1e3, "grad_norm": 1.0}
    tinybert = [{"step": s, "hidden_loss": 2.0 - s / 10, "attention_loss": 0.01, "mlm_loss": 9.0, "loss": 3.0,
                 "stage": 1, **common} for s in range(1, 5)]
    tinybert += [{"step": s, "soft_loss": 9.0 - s / 10, "mlm_loss": 8.9, "loss": 9.0, "stage": 2, **common}
                 for s in range(5, 9)]
    valid = [{"step": 4, "valid_hidden_loss": 1.5, "valid_loss": 2.3, "valid_stage": 1},
             {"step": 8, "valid_soft_loss": 8.9, "valid_loss": 8.9, "valid_stage": 2}]
    fig = _report_figure(tmp_path / "tinybert", tinybert, valid, monkeypatch)
    for ax in fig.axes:
        assert [list(line.get_xdata()) for line in ax.get_lines() if line.get_label().startswith("_child")] == \
            [[4.5, 4.5]], ax.get_title()
        for label, pieces in _curves(ax).items():  # the model's measures: no piece spans steps 4 to 5; the lr goes on
            spans = [min(p)[0] <= 4 < 5 <= max(p)[0] for p in pieces]
            assert spans == ([] if not pieces else [False] * len(pieces)) if ax.get_title() in (
                "loss", "loss terms", "accuracy") else spans == [True], (label, pieces)
    drawn = {label: pieces for ax in fig.axes for label, pieces in _curves(ax).items()}
    assert len(drawn["loss"]) == len(drawn["mlm_loss"]) == 2 and len(drawn["hidden_loss"]) == 1
    assert {"hidden_loss", "attention_loss", "soft_loss", "valid hidden_loss", "valid soft_loss"} <= set(drawn)


def test_report_of_a_one_step_run_marks_its_points_on_whole_steps(tmp_path, monkeypatch):
    """A 1-step run: each panel's single point is drawn (a marker, not a line of one point) and the step axis is
    numbered in whole steps (not 0.96 .. 1.04); a few steps are numbered whole too."""
    row = {"step": 1, "mlm_loss": 9.0, "mlm_acc": 0.0, "nsp_loss": 0.7, "nsp_acc": 0.5, "loss": 9.7, "lr": 1e-3,
           "tokens_per_s": 1e3, "grad_norm": 1.5}
    for steps in (1, 3):
        fig = _report_figure(tmp_path / str(steps), [{**row, "step": s} for s in range(1, steps + 1)], [], monkeypatch)
        fig.canvas.draw()
        for ax in fig.axes:
            lines = ax.get_lines()
            assert lines and all(line.get_marker() not in (None, "", "None") for line in lines), ax.get_title()
            low, high = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if low <= t <= high]
            assert ticks and all(t == int(t) for t in ticks), (ax.get_title(), ticks)
