"""The command line: `ptm` dispatch, and --help that explains every option."""
import argparse
import importlib
import os
import subprocess

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
    assert bad.returncode != 0 and "unknown command 'frobnicate'" in bad.stderr


def test_size_arguments():
    assert size_arg("256MB") == 256 << 20 and size_arg("64KiB") == 64 << 10 and size_arg("1000") == 1000
    proc = run_cli("data_prep", "build", "x.txt", "--out", "o", "--shard-size", "lots", check=False)
    assert proc.returncode == 2 and "is not a size" in proc.stderr
