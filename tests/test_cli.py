"""The command line: `ptm` dispatch, and --help that explains every option."""
import argparse
import importlib
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from data_prep.cli import size_arg


@pytest.mark.parametrize("package", ["data_prep", "pretrain", "launchers", "checkpoints_tools"])
def test_every_option_has_help(package):
    ap = importlib.import_module(f"{package}.cli").parser()
    subs = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subs.choices.items():
        for action in sub._actions:
            assert action.help and len(action.help) > 10, f"{name} {action.option_strings or action.dest}"


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
