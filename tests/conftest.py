"""Shared fixtures: the real embedded corpus (small slices of it) and tokenizers trained on it; under CI=true a skip
is a failure."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels (liger-kernel's) run on the CPU, interpreted
# One torch thread per process: `make test` runs two workers on two cores, and torch's default (a thread per core)
# oversubscribes them; its OpenMP threads then spin waiting for a preempted peer (a one-process launch beside a
# busy core: 66 s instead of 17). torchrun sets the same for launches of more than one process.
os.environ.setdefault("OMP_NUM_THREADS", "1")
CI_HINT = "CI=true: a missing component is a failure, not a skip"


def _fail_skip_in_ci(report):
    """Under CI=true a skip (of a test, its fixtures or its whole module) becomes a failure keeping the skip's
    reason; an xfail stays an xfail."""
    if os.environ.get("CI") == "true" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"{reason} ({CI_HINT})"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    _fail_skip_in_ci(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    _fail_skip_in_ci(report)
    return report


SLURM_MODULES = ("test_build", "test_launchers", "test_slurm")  # the modules that use the Slurm cluster
LONGEST = ("test_fidelity", "slurm", "test_resume", "test_bench", "test_engine", "test_compiled")  # longest first


def unit(nodeid: str) -> str:
    """A test's unit of work: its module; the modules that use the Slurm cluster are one unit."""
    module = nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
    return "slurm" if module in SLURM_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs two pytest-xdist workers (`-n 2 --dist loadfile`), which overlap one's waits (process
    start-up, Slurm's scheduling, signals) with the other's work. Each unit goes whole to one worker, so its
    module-scoped fixtures run once and one Slurm cluster starts."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    return ByUnit(config, log)


def pytest_collection_modifyitems(items):
    """The longest units first (xdist keeps this order with --no-loadscope-reorder), so that neither worker is
    left with one at the end; a test that uses the Slurm cluster outside SLURM_MODULES is an error."""
    strays = sorted({item.module.__name__ for item in items if "slurm" in item.fixturenames} - set(SLURM_MODULES))
    if strays:
        raise pytest.UsageError(f"{', '.join(strays)} use the Slurm cluster: add them to SLURM_MODULES in conftest.py")
    rank = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(unit(item.nodeid), len(LONGEST)))  # stable: the rest keep their order


WORKERS: dict[str, set[str]] = {}  # in xdist's controller: each unit, the workers that ran its tests


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)  # the worker a report came from, in xdist's controller
    if node is not None:
        WORKERS.setdefault(unit(report.nodeid), set()).add(node.gateway.id)


def pytest_sessionfinish(session):
    """Under --dist loadfile a unit split over workers fails the run: its module fixtures ran twice (a second Slurm
    cluster), which the scheduler above exists to prevent."""
    split = sorted(name for name, workers in WORKERS.items() if len(workers) > 1)
    if split and session.config.getvalue("dist") == "loadfile":
        terminal = session.config.pluginmanager.get_plugin("terminalreporter")
        terminal.ensure_newline()
        terminal.write_line(
            f"conftest: {', '.join(split)} ran on more than one xdist worker: pytest_xdist_make_scheduler "
            "no longer keeps each unit whole (a pytest-xdist change?)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    """Outside CI, end the run with what was skipped and why (CI=true fails them instead)."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reasons[reason.removeprefix("Skipped: ")] = reasons.get(reason.removeprefix("Skipped: "), 0) + 1
    if reasons:
        terminalreporter.section(f"{sum(reasons.values())} skipped here (with CI=true they fail)", yellow=True)
        for reason, count in sorted(reasons.items(), key=lambda r: -r[1]):
            terminalreporter.line(f"{count:4d} x {reason}")


def run_cli(*args, check=True, env=None, timeout=600):
    """Run `python -m MODULE ...` the way a user does; returns the CompletedProcess."""
    proc = subprocess.run([sys.executable, "-m", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def call_cli(module: str, *args, check=True):
    """`python -m MODULE ...` through MODULE.cli.main inside this process: what the command writes, without an
    interpreter's start-up and imports (checkpoints_tools: ~7 CPU-s). For tests of a command's files and report; tests
    of how its process ends (exit status, the one error line and nothing else on stderr) use run_cli. The global RNG
    is left as it was. Returns a CompletedProcess of what main printed."""
    import contextlib
    import importlib
    import io

    import torch

    out, err, code = io.StringIO(), io.StringIO(), 0
    with torch.random.fork_rng(devices=[]), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            importlib.import_module(f"{module}.cli").main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
    proc = subprocess.CompletedProcess([module, *map(str, args)], code, out.getvalue(), err.getvalue())
    if check and code:
        raise AssertionError(f"{args} exited {code}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return str(path)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """The embedded default corpus: {'en': [...], 'zh': [...]} documents and the directory holding it."""
    from data_prep.corpus import write_default_corpus

    d = tmp_path_factory.mktemp("corpus")
    write_default_corpus(str(d))
    return {"dir": str(d), "en": [r["text"] for r in read_jsonl(d / "en.jsonl")],
            "zh": [r["text"] for r in read_jsonl(d / "zh.jsonl")]}


@pytest.fixture(scope="session")
def small(corpus, tmp_path_factory):
    """A small mixed slice (300 English + 400 Chinese documents) as one JSONL file."""
    d = tmp_path_factory.mktemp("small")
    docs = corpus["en"][:300] + corpus["zh"][:400]
    return {"docs": docs, "path": write_jsonl(d / "small.jsonl", [{"text": t} for t in docs])}


@pytest.fixture(scope="session")
def sp_model(small, tmp_path_factory):
    """A sentencepiece tokenizer directory trained by data_prep on the small slice."""
    from data_prep.build import BuildOptions, train_tokenizer

    d = str(tmp_path_factory.mktemp("spm"))
    train_tokenizer([small["path"]], BuildOptions(inputs=[small["path"]], out=d, vocab_size=3000, num_unused=10), d)
    return d


@pytest.fixture(scope="session")
def train_data(small, sp_model, tmp_path_factory):
    """A ptm dataset of the small slice with the sentencepiece tokenizer: what the training tests train on."""
    from helpers import quick_build

    out = tmp_path_factory.mktemp("train_data") / "ds"
    quick_build([small["path"]], out, tokenizer=sp_model)
    return str(out)


@pytest.fixture(scope="session")
def words_data(train_data, tmp_path_factory):
    """The training dataset's words (`data_prep words`): what ELMo trains on. Built into a directory not made yet, as
    `ptm compare` builds OUT/data/words."""
    from data_prep.words import build_words

    out = str(tmp_path_factory.mktemp("words") / "data" / "words")
    build_words(train_data, out, progress=False)
    return out


@pytest.fixture(scope="session")
def bert_teacher(train_data, tmp_path_factory):
    """A 4-layer bert-tiny trained a few steps (one process): what the distillation tests distil."""
    from pretrain.config import load
    from pretrain.train import train

    out = tmp_path_factory.mktemp("teacher") / "bert"
    train(load("bert-tiny", [f"data.path={train_data}", f"out_dir={out}", "model.num_layers=4", "data.seq_len=32",
                             "model.max_position_embeddings=32", "train.steps=3", "train.global_batch_size=8",
                             "train.micro_batch_size=8", "optimizer.warmup_steps=1", "train.eval_interval=0",
                             "checkpoint.interval=0", "data.num_workers=0", "data.valid_fraction=0.02",
                             "optimizer.lr=0.01"]))
    return str(out)


@pytest.fixture(scope="session")
def t5_data(small, sp_model, tmp_path_factory):
    """The small slice with the shared tokenizer plus T5's 100 sentinels (`data_prep build --sentinels 100`): what
    span corruption trains on."""
    from helpers import quick_build

    out = tmp_path_factory.mktemp("t5_data") / "ds"
    quick_build([small["path"]], out, tokenizer=sp_model, sentinels=100)
    return str(out)


@pytest.fixture(scope="session")
def wordpiece_vocab(corpus, tmp_path_factory):
    """A BERT-style vocab.txt, made by HF tokenizers' WordPiece trainer (the public format)."""
    from tokenizers import BertWordPieceTokenizer

    d = str(tmp_path_factory.mktemp("wordpiece"))
    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(corpus["en"], vocab_size=3000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.save_model(d)
    return os.path.join(d, "vocab.txt")


@pytest.fixture(scope="session")
def gpt2_vocab(corpus, tmp_path_factory):
    """GPT-2-style byte-level BPE files vocab.json + merges.txt."""
    from tokenizers import ByteLevelBPETokenizer

    d = str(tmp_path_factory.mktemp("gpt2"))
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(corpus["en"], vocab_size=1500, special_tokens=["<|endoftext|>"])
    tok.save_model(d)
    return os.path.join(d, "vocab.json")


@pytest.fixture(scope="session")
def gpt_vocab(corpus, tmp_path_factory):
    """GPT's (2018) kind of BPE: vocab.json + merges.txt of lower-cased words of characters ending in </w>, split as
    BERT splits text, with <unk> and, for its documents' ends, </s> (OpenAI's own has <unk> alone)."""
    from tokenizers import CharBPETokenizer

    d = str(tmp_path_factory.mktemp("gpt"))
    tok = CharBPETokenizer(lowercase=True)
    tok.train_from_iterator(corpus["en"], vocab_size=1500, special_tokens=["<unk>", "</s>"])
    tok.save_model(d)
    return os.path.join(d, "vocab.json")


@pytest.fixture(scope="session")
def t5_spiece(corpus, tmp_path_factory):
    """A directory holding a sentencepiece `spiece.model` with T5's pieces <pad> </s> <unk> at ids 0-2 (control pieces,
    no user-defined ones), as T5's tokenizers read it."""
    import sentencepiece as spm

    d = tmp_path_factory.mktemp("t5src")
    spm.SentencePieceTrainer.train(sentence_iterator=iter(corpus["en"][:2000]), model_prefix=str(d / "spiece"),
                                   vocab_size=500, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2)
    return str(d)


@pytest.fixture(scope="session")
def roberta_vocab(corpus, tmp_path_factory):
    """RoBERTa-style byte-level BPE files: vocab.json + merges.txt with <s> <pad> </s> <unk> <mask> (pad id 1)."""
    from tokenizers import ByteLevelBPETokenizer

    d = str(tmp_path_factory.mktemp("roberta"))
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(corpus["en"], vocab_size=1500, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tok.save_model(d)
    return os.path.join(d, "vocab.json")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real single-node Slurm cluster on loopback (needs root and Debian's slurmctld/slurmd)."""
    from slurm_cluster import SlurmCluster

    if not SlurmCluster.available():
        pytest.skip("Slurm (slurmctld, slurmd) not installed (scripts/setup.sh installs it)")
    cluster = SlurmCluster(str(tmp_path_factory.mktemp("slurm"))).start()
    yield cluster
    cluster.stop()
