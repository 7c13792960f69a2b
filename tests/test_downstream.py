"""ptm eval (downstream/): task files and their errors, metrics against hand-computed values, every family's head
against transformers loading the same export, padding that changes no prediction, ELMo under its task model, zero-shot
scores, data parallel = one process, and a re-run that skips finished tasks."""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT, free_port

transformers = pytest.importorskip("transformers")
pytest.importorskip("sklearn")
pytest.importorskip("seqeval")

from downstream import TaskError  # noqa: E402
from downstream import finetune as FT  # noqa: E402
from downstream import metrics as MX  # noqa: E402
from downstream import models as M  # noqa: E402
from downstream import shipped  # noqa: E402
from downstream import tasks as T  # noqa: E402
from downstream.encode import Encoder  # noqa: E402

FAMILIES = ["bert-tiny", "roberta-tiny", "albert-tiny", "electra-tiny", "distilbert-tiny", "ernie-tiny", "nezha-tiny",
            "gpt-tiny", "gpt2-tiny", "gpt3-tiny", "t5-tiny", "bart-tiny", "xlnet-tiny", "transfo-xl-tiny"]
SMALL = ["model.hidden_size=32", "model.num_heads=2", "model.ffn_hidden_size=128", "model.num_layers=2",
         "model.max_position_embeddings=64", "model.hidden_dropout=0", "model.attention_dropout=0"]


def at_init(preset: str, tok_dir: str, out) -> str:
    """A ptm run holding `preset`'s model (narrowed) as initialised: what an export of that family looks like."""
    from data_prep.tokenizer import load_tokenizer
    from helpers import run_at_init
    from pretrain.config import load

    extra = [] if preset.startswith("elmo") else SMALL
    cfg = load(preset, [f"model.vocab_size={load_tokenizer(tok_dir).vocab_size}", *extra]).model
    return run_at_init(cfg, tok_dir, out, step=1)[1]


@pytest.fixture(scope="module")
def exports(sp_model, t5_data, tmp_path_factory):
    """{preset: Hugging Face directory} of every exported family, written by `checkpoints_tools.hf.to_hf`."""
    from checkpoints_tools import hf

    out = {}
    for preset in FAMILIES:
        d = tmp_path_factory.mktemp(preset)
        tok = os.path.join(t5_data, "tokenizer") if preset.startswith("t5") else sp_model
        out[preset] = hf.to_hf(at_init(preset, tok, d), str(d / "hf"))
    return out


@pytest.fixture(scope="module")
def task_dir(corpus, tmp_path_factory):
    """The shipped tasks, small."""
    d = tmp_path_factory.mktemp("tasks")
    shipped.write(str(d), corpus["dir"], max_train=48, max_dev=24)
    return d


def _tiny(task: T.Task, train: int = 16, dev: int = 8) -> T.Task:
    return T.Task(task.name, task.kind, task.train[:train], task.dev[:dev], task.labels, task.metrics, task.cloze)


# ---- task files -------------------------------------------------------------------------------------------------

def test_shipped_tasks_have_labels_known_by_construction(task_dir, corpus):
    follow = T.load(str(task_dir / "follow"))
    for e in follow.train + follow.dev:  # the answer is the sentence after the question's, in the context
        text, start = e.answers[0]
        assert e.context[start:start + len(text)] == text
        assert e.context.index(e.question) + len(e.question) <= start
    consecutive = {pair for _, _, text in shipped._documents(corpus["dir"])
                   for s in [shipped._sentences(text)] for pair in zip(s, s[1:])}
    order = T.load(str(task_dir / "order"))
    assert {e.label for e in order.train} == {"kept", "swapped"}
    assert all((e.texts if e.label == "kept" else e.texts[::-1]) in consecutive for e in order.train + order.dev)
    nxt = T.load(str(task_dir / "next"))
    assert all(e.texts in consecutive for e in nxt.train if e.label == "yes")
    assert sum(e.texts not in consecutive for e in nxt.train if e.label == "no") >= 0.95 * sum(
        e.label == "no" for e in nxt.train)
    code = T.load(str(task_dir / "code"))
    tagged = {w for e in code.train for w, t in zip(e.words, e.tags) if t == "B-CODE"}
    assert tagged and all("_" in w or "." in w.strip(".") or w.endswith("()") for w in tagged)
    position = T.load(str(task_dir / "position"))
    assert {0.0, 1.0} <= {e.label for e in position.train} and position.kind == "regression"
    source = T.load(str(task_dir / "source"))
    assert source.labels == sorted(shipped.SOURCES) and source.cloze["verbalizer"] == shipped.SOURCES
    assert os.path.getsize(task_dir / "text" / "last_word.txt") > 0


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("case", ["tsv", "jsonl", "conll", "squad", "label", "yaml", "known", "booleans", "nan",
                                  "cloze", "null", "text", "labels", "null-text", "one-class", "latin-1", "tag-column",
                                  "squad-shape", "no-answers", "empty-answer", "start-text", "columns-twice",
                                  "known-labels"])
def test_bad_task_files_get_one_line_naming_file_line_and_fix(tmp_path, case, capsys):
    d = tmp_path / case
    spec = {"kind": "classification", "train": "train.tsv", "dev": "dev.tsv", "text": ["sentence"], "label": "label"}
    good = "sentence\tlabel\nfine text\ta\nmore text\tb\n"
    if case == "tsv":
        _write(d / "train.tsv", "sentence\tlabel\nfine\ta\nbroken line without a tab\n")
        _write(d / "dev.tsv", good)
        want = ["train.tsv:3:", "1 tab-separated fields where the header has 2"]
    elif case == "jsonl":
        spec.update(train="train.jsonl", dev="dev.jsonl")
        _write(d / "train.jsonl", '{"sentence": "a", "label": "x"}\n{"sentence": "b", label: 1}\n')
        _write(d / "dev.jsonl", '{"sentence": "a", "label": "x"}\n')
        want = ["train.jsonl:2:", "one JSON object per line"]
    elif case == "conll":
        spec = {"kind": "tagging", "train": "train.txt", "dev": "dev.txt"}
        _write(d / "train.txt", "EU B-ORG\nrejects O\n\nGerman B-MISC\ncall PER\n")
        _write(d / "dev.txt", "EU B-ORG\n")
        want = ["train.txt:5:", "tag 'PER' is not BIO"]
    elif case == "squad":
        spec = {"kind": "qa", "train": "train.json", "dev": "dev.json"}
        para = {"context": "The cat sat on the mat.", "qas": [{"id": "q1", "question": "Where?",
                                                               "answers": [{"text": "the mat", "answer_start": 3}]}]}
        _write(d / "train.json", json.dumps({"data": [{"paragraphs": [para]}]}, indent=1))
        _write(d / "dev.json", json.dumps({"data": []}))
        want = ["train.json:", "answer 'the mat' is not at answer_start=3", "fix answer_start"]
    elif case == "label":
        _write(d / "train.tsv", good)
        _write(d / "dev.tsv", "sentence\tlabel\nx\tc\n")
        want = ["dev.tsv:2: the example has label 'c'", "list it in `labels:`"]
    elif case == "booleans":  # `labels: [no, yes]` unquoted
        spec["labels"] = [False, True]
        _write(d / "train.tsv", good)
        _write(d / "dev.tsv", good)
        want = ["task.yaml: labels [False, True] holds true/false", "quote them"]
    elif case == "nan":
        spec["kind"] = "regression"
        _write(d / "train.tsv", "sentence\tlabel\nfine text\t0.5\nmore text\tnan\n")
        _write(d / "dev.tsv", good)
        want = ["train.tsv:3: label='nan' is not a finite number"]
    elif case == "cloze":
        spec["cloze"] = {"pattern": "{topic}: {text} {mask}", "verbalizer": {"a": "x", "b": "y"}}
        _write(d / "train.tsv", good)
        _write(d / "dev.tsv", good)
        want = ["cloze.pattern '{topic}: {text} {mask}' names a field other than {text}", "KeyError: 'topic'"]
    elif case == "null":
        spec.update(train="train.jsonl", dev="dev.jsonl")
        _write(d / "train.jsonl", '{"sentence": "a", "label": "x"}\n{"sentence": "b", "label": null}\n')
        _write(d / "dev.jsonl", '{"sentence": "a", "label": "x"}\n')
        want = ["train.jsonl:2: label is null", "give every example its label"]
    elif case == "text":
        spec["text"] = 5
        _write(d / "train.tsv", good)
        _write(d / "dev.tsv", good)
        want = ["text=5 in task.yaml", "name the field(s) holding the text"]
    elif case == "labels":  # a string: once read as its characters' classes
        spec["labels"] = "a,b"
        _write(d / "train.tsv", good)
        _write(d / "dev.tsv", good)
        want = ["task.yaml: labels='a,b' is not a list", "labels: [a, b, ...]"]
    elif case == "null-text":  # once the text "None"
        spec.update(train="train.jsonl", dev="dev.jsonl")
        _write(d / "train.jsonl", '{"sentence": "a", "label": "x"}\n{"sentence": null, "label": "y"}\n')
        _write(d / "dev.jsonl", '{"sentence": "a", "label": "x"}\n')
        want = ["train.jsonl:2: sentence is null", "give every example its text"]
    elif case == "one-class":  # once a trivial accuracy of 1.0
        _write(d / "train.tsv", "sentence\tlabel\nfine text\ta\nmore text\ta\n")
        _write(d / "dev.tsv", "sentence\tlabel\nfine text\ta\n")
        want = ["task.yaml: one class (a)", "a classifier needs two at least"]
    elif case == "latin-1":
        _write(d / "train.tsv", good)
        (d / "dev.tsv").write_bytes("sentence\tlabel\nfine\ta\ncaf\u00e9\tb\n".encode("latin-1"))
        want = ["dev.tsv:3: not UTF-8 text (byte 0xe9)", "save the file as UTF-8"]
    elif case == "tag-column":
        spec = {"kind": "tagging", "train": "train.txt", "dev": "dev.txt", "tag_column": 3}
        _write(d / "train.txt", "EU NNP B-ORG\n")
        _write(d / "dev.txt", "EU NNP B-ORG\n")
        want = ["train.txt:1: 3 columns, no token_column=0 and tag_column=3"]
    elif case in ("squad-shape", "no-answers", "empty-answer", "start-text"):
        spec = {"kind": "qa", "train": "train.json", "dev": "dev.json"}
        qa = {"id": "q1", "question": "Where?", "answers": [{"text": "the mat", "answer_start": 15}]}
        qa["answers"][0].update({"empty-answer": {"text": ""}, "start-text": {"answer_start": "15"}}.get(case, {}))
        if case == "no-answers":
            qa["answer"] = qa.pop("answers")  # (once read as an unanswerable question)
        data = {"paragraphs": [{"context": "The cat sat on the mat.", "qas": [qa]}]}
        _write(d / "train.json", json.dumps({"data": data if case == "squad-shape" else [data]}, indent=1))
        _write(d / "dev.json", json.dumps({"data": [data]}))
        want = {"squad-shape": ["train.json: not SQuAD's shape"],
                "no-answers": ["train.json:", "question 'q1' has no \"answers\" list", "\"answers\": []"],
                "empty-answer": ["train.json:", "answer text '' is not a text"],
                "start-text": ["answer_start='15' is not a whole number"]}[case]
    elif case == "columns-twice":  # (the last of them was read)
        _write(d / "train.tsv", "sentence\tsentence\tlabel\nfine\ttext\ta\n")
        _write(d / "dev.tsv", good)
        want = ["train.tsv:1: the columns name sentence twice"]
    elif case == "known-labels":  # (it named a task.yaml that is not there)
        _write(d / "train.txt", "EU B-ORG\nMonday B-DATE\n")
        _write(d / "valid.txt", "EU B-ORG\n")
        want = ["train.txt:1: the example has label 'B-DATE'", "list it in `labels:` of the conll2003 layout (a ",
                "task.yaml would override it)"]
    elif case == "yaml":
        spec = {"kind": "classify", "train": "train.tsv", "dev": "dev.tsv"}
        _write(d / "train.tsv", good)
        want = ["task.yaml: kind='classify'", "classification | regression | tagging | qa"]
    else:
        want = ["'glue' is not a known task", "pass a directory with a task.yaml"]
    if not case.startswith("known"):
        import yaml

        _write(d / "task.yaml", yaml.safe_dump(spec))
    arg = {"known": f"glue={d}", "known-labels": f"conll2003={d}"}.get(case, str(d))
    with pytest.raises(TaskError) as e:
        T.load(arg)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in want), msg
    # the CLI prints it as one line and exits non-zero, before any model is touched
    from downstream import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["eval", str(tmp_path / "no-model"), "--task", arg])
    assert stop.value.code == 2 and capsys.readouterr().err == f"downstream: error: {msg}\n"
    if case == "tsv":  # and so does the command
        proc = subprocess.run([sys.executable, "-m", "downstream", "eval", str(tmp_path / "no-model"), "--task", arg],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == f"downstream: error: {msg}"


def test_task_files_read_as_meant_and_zero_shot_scores_what_they_name(exports, tmp_path):
    """A TSV with a header row and `columns:` too: the header is no example (it was one, of a class 'label'); the
    last word of a passage is its word without the punctuation after it (LAMBADA's); a cloze pattern with its mask
    before a long text keeps the mask (the text is cut: the prompt was, and the mask went)."""
    from downstream import zero_shot as Z

    d = tmp_path / "cols"
    _write(d / "task.yaml", "kind: classification\ntrain: train.tsv\ndev: dev.tsv\ncolumns: [sentence, label]\n"
                            "text: sentence\nlabel: label\n")
    for split in ("train", "dev"):
        _write(d / f"{split}.tsv", "sentence\tlabel\nfine text\ta\nmore text\tb\n")
    task = T.load(str(d))
    assert task.labels == ["a", "b"] and [e.texts for e in task.train] == [("fine text",), ("more text",)]
    _write(d / "task.yaml", "kind: classification\ntrain: train.jsonl\ndev: dev.jsonl\ntext: s\n")
    for split in ("train", "dev"):  # JSON's 1 and 1.0 are one class (they were two)
        _write(d / f"{split}.jsonl", '{"s": "a", "label": 1}\n{"s": "b", "label": 1.0}\n{"s": "c", "label": 0}\n')
    assert T.load(str(d)).labels == ["0", "1"]
    assert Z.last_word_split("The cat sat on the mat.") == ("The cat sat on the", " mat")
    assert Z.last_word_split("It was fine .") == ("It was", " fine") and Z.last_word_split("Hello!") == ("", "")
    source = M.resolve(exports["bert-tiny"], str(tmp_path))
    tok = M.tokenizer(source)
    prompt = Z._fitted(tok, "{mask} : {text}", {"text": "word " * 200, "text_a": "", "text_b": ""},
                       tok.mask_token * 2, 32)
    ids = tok(prompt)["input_ids"]
    assert len(ids) <= 32 and ids.count(tok.mask_token_id) == 2


def test_a_task_directory_whose_path_holds_an_equals_sign(task_dir, tmp_path):
    """`--task runs/lr=1e-4/next` is that directory, not the known layout `runs/lr` of the files in `1e-4/next`."""
    shutil.copytree(task_dir / "next", tmp_path / "lr=1e-4" / "next")
    task = T.load(str(tmp_path / "lr=1e-4" / "next"))
    assert (task.name, len(task.dev)) == ("next", len(T.load(str(task_dir / "next")).dev))


def test_save_model_keeps_the_reported_rates_best_seed(monkeypatch, tmp_path):
    """--save-model saves the best seed at the learning rate the result reports (best median), not the best single
    run of the grid, which may be of another rate."""
    scores = {(1e-3, 1): 0.9, (1e-3, 2): 0.1, (1e-4, 1): 0.6, (1e-4, 2): 0.7}  # medians 0.5 and 0.65
    saved = []

    class Model:
        def __init__(self, lr, seed):
            self.run = (lr, seed)

        def save(self, directory, tok):
            os.makedirs(directory)  # (written beside models/, then put there whole)
            saved.append(self.run)

    def run_one(source, task, lr, seed, opts):
        return {"accuracy": scores[lr, seed]}, {"loss": [], "dev": []}, Model(lr, seed), types.SimpleNamespace(tok=0)

    monkeypatch.setattr(FT, "run_one", run_one)
    monkeypatch.setattr(FT.M, "head_name", lambda model: "head")
    task = T.Task("t", "classification", [T.Example(texts=("a",), label="x")], [], ["x"], ["accuracy"])
    out = FT.finetune(types.SimpleNamespace(elmo=False), task, FT.Options(lrs=(1e-3, 1e-4), seeds=(1, 2),
                                                                           save_dir=str(tmp_path / "models")))
    assert (out["lr"], out["median"], saved) == (1e-4, pytest.approx(0.65), [(1e-4, 2)])
    assert os.listdir(tmp_path) == ["models"]


def test_one_metric_is_named_without_a_list(task_dir, tmp_path):
    import yaml

    shutil.copytree(task_dir / "next", tmp_path / "next")
    spec = yaml.safe_load((tmp_path / "next" / "task.yaml").read_text())
    (tmp_path / "next" / "task.yaml").write_text(yaml.safe_dump({**spec, "metrics": "mcc"}))
    assert T.load(str(tmp_path / "next")).metrics == ["mcc"]


def test_eval_of_what_is_no_model_is_one_line_and_writes_nothing(task_dir, tmp_path, capsys):
    from downstream import cli

    (tmp_path / "empty").mkdir()
    for model, says in ((tmp_path / "none", "no such directory; pass a ptm run's out_dir"),
                        (tmp_path / "empty", "holds no Hugging Face (config.json) or ELMo (options.json) export")):
        with pytest.raises(SystemExit) as stop:
            cli.main(["eval", str(model), "--task", str(task_dir / "next"), "--out", str(tmp_path / "out"), "--cloze"])
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if ": error: " in line]
        assert stop.value.code == 2 and len(errors) == 1 and errors[0].startswith(f"downstream: error: {model}")
        assert says in errors[0]
        assert "--cloze scores nothing: no --task has a cloze pattern" in err  # `next` has none
    assert not (tmp_path / "out").exists()


def test_known_layouts_read_glue_conll_and_squad_files_as_shipped(tmp_path):
    _write(tmp_path / "mrpc" / "train.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA b.\tA c.\n")
    _write(tmp_path / "mrpc" / "dev.tsv", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n0\t3\t4\tX.\tY.\n")
    mrpc = T.load(f"mrpc={tmp_path / 'mrpc'}")
    assert mrpc.train[0].texts == ("A b.", "A c.") and mrpc.labels == ["0", "1"] and mrpc.metrics[0] == "f1"
    _write(tmp_path / "cola" / "train.tsv", "gj04\t1\t\tThe book fell.\ngj04\t0\t*\tBook the fell.\n")
    _write(tmp_path / "cola" / "dev.tsv", "gj04\t1\t\tIt rains.\n")
    cola = T.load(f"cola={tmp_path / 'cola'}")  # no header row
    assert cola.train[1].texts == ("Book the fell.",) and cola.metrics[0] == "mcc"
    _write(tmp_path / "ner" / "train.txt", "-DOCSTART- -X- O O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n")
    _write(tmp_path / "ner" / "valid.txt", "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n")
    ner = T.load(f"conll2003={tmp_path / 'ner'}")
    assert ner.train[0].words == ["EU", "rejects"] and ner.dev[0].tags == ["B-PER", "I-PER"]


# ---- metrics ----------------------------------------------------------------------------------------------------

def test_metrics_equal_hand_computed_values():
    gold, pred = ["a", "b", "b", "a", "b"], ["a", "b", "a", "a", "b"]
    m = MX.classification(gold, pred, ["a", "b"], ["accuracy", "f1", "mcc"])
    # TP=2 TN=2 FP=0 FN=1 for class b: F1 = 2PR/(P+R) with P=1, R=2/3; MCC = (2*2-0*1)/sqrt(2*3*2*3)
    assert m == pytest.approx({"accuracy": 0.8, "f1": 0.8, "mcc": 4 / 6})
    x, y = [1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 2.0, 5.0]
    mx, my = sum(x) / 4, sum(y) / 4
    r = sum((a - mx) * (b - my) for a, b in zip(x, y)) / math.sqrt(sum((a - mx) ** 2 for a in x) *
                                                                    sum((b - my) ** 2 for b in y))
    # ranks of y: 1, 3, 2, 4 -> Spearman = 1 - 6 * sum d^2 / (n (n^2 - 1)) = 1 - 6 * 2 / 60
    assert MX.regression(x, y, ["pearson", "spearman"]) == pytest.approx({"pearson": r, "spearman": 0.8})
    t = MX.tagging([["B-X", "I-X", "O", "B-Y"]], [["B-X", "I-X", "O", "O"]], ["f1", "precision", "recall"])
    assert t == pytest.approx({"f1": 2 / 3, "precision": 1.0, "recall": 0.5})  # X found, Y missed
    qa = MX.qa([["a cat sat on"], ["Cat sat!"], ["北京"]], ["the cat sat", "cat sat", "北京大学"], ["exact_match", "f1"])
    # F1: (2/3 precision... ) cat,sat vs cat,sat,on -> 0.8; exact -> 1; 北京 in 北京大学 -> P 1/2, R 1 -> 2/3
    assert qa == pytest.approx({"exact_match": 1 / 3, "f1": (0.8 + 1 + 2 / 3) / 3})


# ---- heads: transformers' own, padding, saving ------------------------------------------------------------------

def _inputs(enc, rows, take):
    batch = enc.pad(rows)
    return {k: v for k, v in batch.items() if k in take}


def test_a_left_padded_batch_predicts_and_trains_towards_what_its_rows_alone_do(exports, task_dir, tmp_path):
    """XLNet pads a batch before its tokens: a QA row's answer positions move with its padding (and point at the same
    token), and tagging and QA predictions read each row's own positions, so they do not depend on the batch size
    (they did: a batch of 8 scored QA F1 0.0); a window without the answer points at XLNet's <cls>, its last token."""
    source = M.resolve(exports["xlnet-tiny"], str(tmp_path))
    tok = M.tokenizer(source)
    enc = Encoder(tok, 48)
    assert enc.pads_left
    for kind, name in (("tagging", "code"), ("qa", "follow")):
        task = _tiny(T.load(str(task_dir / name)))
        model, _ = FT.build(source, task, True)
        feats = FT.Features(task, enc, task.dev[:6])
        if kind == "qa":
            inputs, targets = feats.batch(list(range(len(feats.rows))), torch.device("cpu"))
            for j, row in enumerate(feats.rows):
                for key in ("start", "end"):
                    assert inputs["input_ids"][j, targets[key][j]] == row["input_ids"][row[key]]
            assert any(r["start"] == len(r["input_ids"]) - 1 and r["input_ids"][-1] == tok.cls_token_id
                       for r in feats.rows)  # (a window past the answer)
        alone, batched = (FT.predict(model, feats, size, 0, 1, torch.device("cpu")) for size in (1, 8))
        assert alone == batched, kind


@pytest.mark.slow
def test_every_family_fine_tunes_with_its_transformers_head(exports, task_dir, tmp_path):
    """Per family: a classification run (1 epoch) saved and loaded back by transformers' Auto class gives the same
    logits; tagging and QA heads too; a padded batch predicts what each example alone does."""
    tasks = {k: _tiny(T.load(str(task_dir / name))) for k, name in
             (("classification", "next"), ("tagging", "code"), ("qa", "follow"))}
    opts = FT.Options(epochs=1, seeds=(1,), batch_size=8, max_len=48, progress=False)
    heads = {}
    for preset, hf_dir in exports.items():
        source = M.resolve(hf_dir, str(tmp_path))
        for kind, task in tasks.items():
            if kind == "classification":
                _, _, model, enc = FT.run_one(source, task, 1e-3, 1, opts)
            else:
                model, _ = FT.build(source, task, True)
                tok = M.tokenizer(source)
                enc = Encoder(tok, 48)
                enc.takes = ("input_ids", "real" if M.unmasked(source) else "attention_mask") + (
                    ("token_type_ids",) if "token_type_ids" in tok.model_input_names else ())
            model.eval()
            heads[(preset, kind)] = M.head_name(model)
            rows = FT.Features(task, enc, task.dev[:3]).rows[:3]
            take = enc.takes
            with torch.no_grad():
                batch = model(_inputs(enc, rows, take))
                for i, row in enumerate(rows):  # each example alone = its row of the padded batch
                    alone = model(_inputs(enc, [row], take))
                    n = len(row["input_ids"])
                    left = enc.tok.padding_side == "left"
                    for b, a in zip(batch if kind == "qa" else (batch,), alone if kind == "qa" else (alone,)):
                        got = b[i] if kind == "classification" else (b[i, -n:] if left else b[i, :n])
                        torch.testing.assert_close(got, a[0], atol=2e-5, rtol=1e-4, msg=f"{preset} {kind}")
            if kind == "classification":  # what ptm saved is what transformers loads
                model.save(str(tmp_path / preset), enc.tok)
                if isinstance(model, M.HFHead):
                    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(
                        str(tmp_path / preset), trust_remote_code=True).eval()
                    with torch.no_grad():
                        theirs = loaded(**{k: v for k, v in _inputs(enc, rows, take).items() if k != "real"}).logits
                    torch.testing.assert_close(batch, theirs, atol=1e-6, rtol=0)
                    assert type(loaded).__name__ == heads[(preset, kind)]
    # the family's own heads where transformers has them (GPT's reads the last token); a linear head elsewhere
    assert heads[("bert-tiny", "qa")] == "BertForQuestionAnswering"
    assert heads[("gpt2-tiny", "classification")] == "GPT2ForSequenceClassification"
    assert heads[("gpt3-tiny", "tagging")] == "GPTNeoForTokenClassification"
    assert heads[("t5-tiny", "classification")] == "T5ForSequenceClassification"
    assert heads[("bart-tiny", "classification")] == "BartForSequenceClassification"
    assert heads[("xlnet-tiny", "qa")] == "XLNetForQuestionAnsweringSimple"
    assert heads[("bart-tiny", "tagging")].startswith("LinearHead over BartModel")
    assert heads[("nezha-tiny", "classification")].startswith("LinearHead over NezhaModel")
    assert heads[("transfo-xl-tiny", "classification")].startswith("LinearHead over XLNetModel")


def test_feature_based_trains_a_linear_layer_over_frozen_vectors(exports, task_dir, tmp_path):
    """--features: the export's weights stay as they were, only the linear layer learns; `whiten` is the mean of
    transformers' states over real tokens, shifted and rotated so that the training texts' vectors have zero mean and
    identity covariance; a causal model's `first` is its last real token's state."""
    task = _tiny(T.load(str(task_dir / "source")), train=48)
    for preset, features in (("bert-tiny", "whiten"), ("gpt2-tiny", "first")):
        ref = transformers.AutoModel.from_pretrained(exports[preset]).eval()
        source = M.resolve(exports[preset], str(tmp_path))
        opts = FT.Options(epochs=1, seeds=(1,), batch_size=8, max_len=48, progress=False, features=features)
        torch.manual_seed(1)
        start = FT.build(source, task, True, features)[0].out.weight.clone()
        _, _, model, enc = FT.run_one(source, task, 1e-2, 1, opts)
        assert M.head_name(model) == f"LinearHead over {type(ref).__name__} (frozen features: {features})"
        assert not torch.equal(model.out.weight, start)
        for k, v in ref.state_dict().items():
            assert torch.equal(model.base.state_dict()[k], v), k
        model.eval()
        batch, _ = FT.Features(task, enc, task.train).batch(list(range(len(task.train))), torch.device("cpu"))
        with torch.no_grad():
            h = ref(**batch).last_hidden_state.double()
            v = model.vector(model.states(batch), batch["attention_mask"]).double()
        m = batch["attention_mask"].double()
        if features == "whiten":
            mean = (h * m[..., None]).sum(1) / m.sum(1, keepdim=True)
            torch.testing.assert_close(v, (mean - model.shift.double()) @ model.rotate.double(), atol=2e-3, rtol=1e-3)
            torch.testing.assert_close(v.mean(0), torch.zeros(h.shape[-1], dtype=v.dtype), atol=1e-3, rtol=0)
            cov = torch.cov(v.T)  # identity, but for what LayerNorm leaves no variance in (its states sum to 0)
            kept = torch.diag((cov.diagonal() > 0.5).double())
            torch.testing.assert_close(cov, kept, atol=1e-2, rtol=0)
            assert kept.trace() >= h.shape[-1] - 1
        else:
            last = m.cumsum(1).argmax(1)
            torch.testing.assert_close(v, h[torch.arange(len(h)), last], atol=1e-5, rtol=1e-5)


def test_long_texts_keep_head_and_tail(exports):
    tok = transformers.AutoTokenizer.from_pretrained(exports["bert-tiny"])
    enc = Encoder(tok, 24)
    words = " ".join(f"w{i}" for i in range(200))
    full = tok(words, add_special_tokens=False)["input_ids"]
    ids = enc.texts((words,))["input_ids"]
    assert 20 <= len(ids) <= 24 and ids[1:4] == full[:3] and ids[-9:-1] == full[-8:]  # [CLS] head ... tail [SEP]
    short = tok("short one", add_special_tokens=False)["input_ids"]
    pair = enc.texts((words, "short one"))["input_ids"]  # the longer text gives up its middle; the short one stays
    assert len(pair) <= 24 and pair[1:3] == full[:2] and pair[-len(short) - 1:-1] == short
    # pieces of byte fallback each span the whole run of unknown characters: the head and the tail cut from them
    # once held the text twice, and a QA question so cut outgrew the window (a tokenizers error, not a result)
    emoji = "".join(chr(0x1F600 + i) for i in range(12))
    cut = enc._head_tail(emoji, enc._pieces(emoji)[1], 24)
    assert len(enc._pieces(emoji)[0]) > 40 and len(enc._pieces(cut)[0]) <= 25
    assert cut[0] == emoji[0] and cut[-1] == emoji[-1] and len(cut) < len(emoji)
    context = " ".join(f"w{i}" for i in range(60)) + " the answer."
    windows = Encoder(tok, 64).qa(emoji, context, [("the answer", context.index("the answer"))])
    assert all(len(w["input_ids"]) <= 64 for w in windows) and any(w["start"] for w in windows)


# ---- ELMo ----------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_elmo_trains_a_task_model_over_its_frozen_bilm_and_scalar_mix(words_data, task_dir, tmp_path, monkeypatch):
    from downstream import evaluate as E
    from downstream import zero_shot as Z
    from pretrain.elmo_vectors import ELMoEmbedder

    run = at_init("elmo-tiny", os.path.join(words_data, "tokenizer"), tmp_path)
    source = M.resolve(run, str(tmp_path))
    assert source.elmo and not source.hf_dir
    with pytest.raises(TaskError, match="need a causal language model"):  # --text, --last-word: one line, no traceback
        Z.check(source, causal=True, cloze=False)
    with pytest.raises(TaskError, match="cloze scoring needs a masked language model head; elmo has none"):
        E.evaluate(run, str(tmp_path / "cloze"), [str(task_dir / "source")], FT.Options(), cloze=True)  # not silence
    opts = FT.Options(epochs=2, seeds=(1,), batch_size=8, max_len=32, progress=False)
    through_bilm, layers = [], ELMoEmbedder.layers
    monkeypatch.setattr(ELMoEmbedder, "layers", lambda self, texts: through_bilm.extend(map(tuple, texts)) or
                        layers(self, texts))
    for name in ("next", "code", "follow", "position"):
        task = _tiny(T.load(str(task_dir / name)))
        model, inputs = FT.build(source, task, True)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        through_bilm.clear()
        metrics, _, model, inputs = FT.run_one(source, task, 1e-2, 1, opts)
        # each text through the frozen biLM once (the statistics, 2 epochs and 2 evaluations read it back); ("a",):
        # the model's probe of the layers' shape
        texts = collections.Counter(t for t in through_bilm if t != ("a",))
        assert texts and max(texts.values()) == 1 and model.cached_bytes > 0
        after = model.state_dict()
        bilm = [k for k in after if k.startswith("elmo.bilm.")]
        assert bilm and all(torch.equal(before[k], after[k]) for k in bilm)  # frozen
        assert not torch.equal(before["elmo.mixes.0.weights"], after["elmo.mixes.0.weights"])  # the mix learns
        assert set(metrics) == set(task.metrics)
        model.eval()
        if name == "next":  # each layer standardised over the training words (both texts of a pair)
            with torch.no_grad():
                e = model.elmo([t for r in FT.Features(task, inputs, task.train).rows for t in r["words"]])
            x = torch.stack([(y - c) / s for y, c, s in zip(e["layers"], model.center, model.scale)])
            x = x[:, e["mask"]].double()
            torch.testing.assert_close(x.mean(1), torch.zeros_like(x[:, 0]), atol=1e-4, rtol=0)
            torch.testing.assert_close(x.std(1, correction=0), torch.ones_like(x[:, 0]), atol=1e-3, rtol=0)
        rows = FT.Features(task, inputs, task.dev[:3]).rows[:3]
        with torch.no_grad():
            batch = model(inputs.pad(rows, ("labels",) if name == "code" else ()))
            model.cache.clear()
            alone = model(inputs.pad(rows[1:2], ("labels",) if name == "code" else ()))
        b, a = (batch[0], alone[0]) if name == "follow" else (batch, alone)
        n = a.shape[1] if a.ndim > 1 and name != "position" and name != "next" else None
        torch.testing.assert_close(b[1, :n] if n else b[1], a[0], atol=1e-5, rtol=1e-4)  # padding changes nothing


# ---- zero-shot ----------------------------------------------------------------------------------------------------

def test_cloze_scores_the_verbaliser_words_at_the_masks(exports, task_dir, tmp_path):
    from downstream import zero_shot as Z
    from safetensors.torch import load_file, save_file

    task = T.load(str(task_dir / "source"))
    hf_dir = tmp_path / "biased"
    transformers.AutoModelForMaskedLM.from_pretrained(exports["bert-tiny"]).save_pretrained(hf_dir)
    tok = transformers.AutoTokenizer.from_pretrained(exports["bert-tiny"])
    tok.save_pretrained(hf_dir)
    (hf_dir / "ptm_tokenizer.json").write_text("{}")
    favoured = task.labels[2]
    pieces = tok(" " + task.cloze["verbalizer"][favoured], add_special_tokens=False)["input_ids"]
    weights = load_file(hf_dir / "model.safetensors")
    key = next(k for k in weights if k.endswith("predictions.bias"))
    weights[key][pieces] += 50.0  # the MLM head now prefers the favoured label's word at every mask
    save_file(weights, hf_dir / "model.safetensors", metadata={"format": "pt"})
    result = Z.cloze(M.Source(str(hf_dir), hf_dir=str(hf_dir), family="bert"), task)
    share = sum(e.label == favoured for e in task.dev) / len(task.dev)
    assert result["accuracy"] == pytest.approx(share) and result["pieces"][favoured] == len(pieces)


@pytest.mark.parametrize("preset, family", [("gpt2-tiny", "gpt2"), ("transfo-xl-tiny", "xlnet")])
def test_perplexity_and_last_word_match_transformers(exports, tmp_path, preset, family):
    """GPT-2's, and Transformer-XL's (XLNet, attn_type uni: once refused as not causal, then read whole texts at once
    since XLNetConfig says -1 positions)."""
    from downstream import zero_shot as Z

    hf_dir = exports[preset]
    source = M.Source(hf_dir, hf_dir=hf_dir, family=family)
    docs = ["Return the sum of two numbers.", "The cat sat on the mat today."]
    (tmp_path / "t.txt").write_text("\n".join(docs) + "\n")
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    eos = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
    ids = [i for d in docs for i in tok(d, add_special_tokens=False)["input_ids"] + [eos]]
    with torch.no_grad():  # (XLNet's labels are not shifted)
        loss = F.cross_entropy(model(input_ids=torch.tensor([ids])).logits[0, :-1], torch.tensor(ids[1:]))
    got = Z.perplexity(source, str(tmp_path / "t.txt"))
    assert got["tokens"] == len(ids) - 1 and got["perplexity"] == pytest.approx(math.exp(float(loss)), rel=1e-5)
    long = " ".join(f"word{i}" for i in range(120))  # past the 64 positions: windows overlap, each token scored once
    (tmp_path / "long.txt").write_text(long + "\n")
    assert Z.perplexity(source, str(tmp_path / "long.txt"))["tokens"] == \
        len(tok(long, add_special_tokens=False)["input_ids"])
    passages = ["The value of the first argument is returned", "Close the file and return its final position"]
    (tmp_path / "lw.txt").write_text("\n".join(passages) + "\n")
    hits = 0
    for p in passages:  # transformers' greedy generation from the context reproduces the last word, or not
        ctx, target = p[:p.rfind(" ")], p[p.rfind(" "):]
        c = tok(ctx, add_special_tokens=False)["input_ids"]
        t = tok(ctx + target, add_special_tokens=False)["input_ids"][len(c):]
        out = model.generate(torch.tensor([c]), max_new_tokens=len(t), do_sample=False, pad_token_id=eos)
        hits += out[0, len(c):].tolist() == t
    assert Z.last_word(source, str(tmp_path / "lw.txt"))["accuracy"] == hits / 2


# ---- runs: resume, data parallel ----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.distributed
def test_eval_resumes_and_data_parallel_equals_one_process(exports, task_dir, tmp_path, monkeypatch, capsys):
    from downstream import evaluate as E

    small = tmp_path / "next"
    task = T.load(str(task_dir / "next"))
    shutil.copytree(task_dir / "next", small)
    args = ["--epochs", "1", "--seeds", "1", "2", "--lrs", "1e-3", "--batch-size", "8", "--max-len", "48",
            "--max-train", "24", "--save-model", "--no-progress", "--task", str(small)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "downstream", "eval", exports["bert-tiny"], "--out",
                          str(tmp_path / "one"), *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                          f"--master_port={free_port()}", "-m", "downstream", "eval", exports["bert-tiny"], "--out",
                          str(tmp_path / "two"), *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = (json.load(open(tmp_path / d / "results.json"))["tasks"]["next"] for d in ("one", "two"))
    assert a["dev_examples"] == len(task.dev) and a["seeds"] == 2
    for ra, rb in zip(a["grid"]["0.001"]["runs"], b["grid"]["0.001"]["runs"]):  # same losses, step by step
        torch.testing.assert_close(torch.tensor(ra["curve"]["loss"]), torch.tensor(rb["curve"]["loss"]), atol=1e-5,
                                   rtol=1e-5)
    wa = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "one" / "models" / "next")
    wb = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "two" / "models" / "next")
    for (k, x), (_, y) in zip(wa.state_dict().items(), wb.state_dict().items()):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4, msg=k)
    assert "next: accuracy" in one.stdout and (tmp_path / "one" / "curves.png").stat().st_size > 0

    def no_training(*_, **__):
        raise AssertionError("a finished task was fine-tuned again")

    monkeypatch.setattr(FT, "finetune", no_training)  # a re-run with the same options reads what is done
    again = E.evaluate(exports["bert-tiny"], str(tmp_path / "one"), [str(small)], FT.Options(
        epochs=1, seeds=(1, 2), lrs=(1e-3,), batch_size=8, max_len=48, max_train=24, save_dir="yes", progress=False))
    assert again["tasks"]["next"]["median"] == a["median"]
    assert f"downstream: next: the result in {tmp_path / 'one' / 'tasks' / 'next.json'} (same" in capsys.readouterr().err
    opts = FT.Options(epochs=1, seeds=(1, 2), lrs=(1e-3,), batch_size=8, max_len=48, max_train=24, progress=False)
    shutil.rmtree(tmp_path / "one" / "models")  # --save-model where the finished task's model is not saved: run again
    with pytest.raises(AssertionError, match="fine-tuned again"):
        E.evaluate(exports["bert-tiny"], str(tmp_path / "one"), [str(small)], dataclasses.replace(opts, save_dir="y"))
    dev = (small / "dev.jsonl").read_text().splitlines(True)
    (small / "dev.jsonl").write_text("".join(dev[:-1]))  # the task's examples changed: it runs again
    with pytest.raises(AssertionError, match="fine-tuned again"):
        E.evaluate(exports["bert-tiny"], str(tmp_path / "one"), [str(small)], opts)
    # what would fail after the fine-tuning fails before it, in one line
    (tmp_path / "text.txt").write_text("Some text to score.\n")
    for tasks, text, says in (([str(small), str(task_dir / "next")], None, "are both named 'next' (results are kept"),
                              ([str(small)], str(tmp_path / "none.txt"), "none.txt is not a file; give a text file"),
                              ([str(small)], str(tmp_path / "text.txt"), "need a causal language model")):
        with pytest.raises(TaskError, match=re.escape(says)):
            E.evaluate(exports["bert-tiny"], str(tmp_path / "one"), tasks, opts, text=text)


# ---- ptm compare ----------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_compare_resumes_without_retraining_finished_cells(train_data, task_dir, tmp_path, monkeypatch):
    from data_prep.dataset import Corpus
    from downstream import compare as CMP
    from pretrain import cost
    from pretrain.config import load

    sets = [*SMALL, "data.seq_len=32", "train.global_batch_size=8", "train.micro_batch_size=8",
            "data.num_workers=0", "data.valid_fraction=0.05", "train.eval_steps=1"]
    task = [str(task_dir / "next")]
    opts = FT.Options(epochs=1, seeds=(1,), lrs=(1e-3,), batch_size=8, max_len=32, max_train=16, progress=False)
    cell = CMP.plan_cell("gpt-tiny", {"tokens": train_data}, str(tmp_path / "plan"), "flops", 1e10, sets, [])
    vocab = Corpus(train_data).vocab_size  # `ptm plan`'s cost, with the LM head over the dataset's vocabulary
    per_step = cost.flops_per_sample(load("gpt-tiny", [*cell["sets"], f"model.vocab_size={vocab}"])) * 8
    assert cell["steps"] == int(1e10 / per_step) and cell["flops_per_step"] == pytest.approx(per_step)  # whole steps

    real_pretrain, trained, tuned = CMP.pretrain, [], []

    def stop_at_gpt(c, launcher):
        if c["preset"] == "gpt-tiny":
            raise KeyboardInterrupt  # the comparison is stopped before GPT's cell
        return real_pretrain(c, launcher)

    out = str(tmp_path / "cmp")
    monkeypatch.setattr(CMP, "pretrain", stop_at_gpt)
    with pytest.raises(KeyboardInterrupt):
        CMP.compare(["bert-tiny", "gpt-tiny"], train_data, task, "tokens", 8 * 32 * 6, out, opts, sets)
    monkeypatch.setattr(CMP, "pretrain", real_pretrain)
    real_train, real_finetune = CMP._train, FT.finetune
    monkeypatch.setattr(CMP, "_train", lambda preset, *a: (trained.append(preset), real_train(preset, *a)))
    monkeypatch.setattr(FT, "finetune", lambda source, *a: (tuned.append(source.path), real_finetune(source, *a))[1])
    result = CMP.compare(["bert-tiny", "gpt-tiny"], train_data, task, "tokens", 8 * 32 * 6, out, opts, sets)
    assert trained == ["gpt-tiny"] and all("gpt-tiny" in p for p in tuned) and len(tuned) == 2  # + its scratch twin
    rows = {r["preset"]: r for r in result["rows"]}
    assert rows["bert-tiny"]["steps"] == rows["gpt-tiny"]["steps"] == 6
    for r in rows.values():
        assert set(r["eval"]) == {"pretrained", "scratch"} and r["eval"]["pretrained"]["next"]["seeds"] == 1
        assert json.load(open(os.path.join(r["run"], "summary.json")))["steps"] == 6
    assert open(os.path.join(out, "compare.md")).read().count("\n| ") == 2  # a row per preset
    assert os.path.getsize(os.path.join(out, "compare.png")) > 0
    assert not os.path.exists(os.path.join(out, "gpt-tiny", "scratch", "export"))  # the twin reads eval/'s export

    from pretrain import checkpoint as C

    trained.clear(), tuned.clear()
    CMP.compare(["bert-tiny", "gpt-tiny"], train_data, task, "tokens", 8 * 32 * 6, out, opts, sets)
    assert trained == tuned == []  # a finished comparison does nothing again
    run = rows["bert-tiny"]["run"]
    further = os.path.join(run, "checkpoints", "step_00000009")
    shutil.copytree(C.resolve(run), further)
    C.mark_latest(run, os.path.basename(further))  # its run trained further: evaluated again, both twins
    CMP.compare(["bert-tiny", "gpt-tiny"], train_data, task, "tokens", 8 * 32 * 6, out, opts, sets)
    assert trained == [] and len(tuned) == 2 and all("bert-tiny" in p for p in tuned)
    stamp = json.load(open(os.path.join(out, "bert-tiny", "eval", "export", "ptm_source.json")))
    assert stamp["checkpoint"] == os.path.abspath(further)
    with pytest.raises(TaskError, match=r"bert-tiny's pretraining of another budget or --set \(train.steps 6 -> 12"):
        CMP.compare(["bert-tiny", "gpt-tiny"], train_data, task, "tokens", 8 * 32 * 12, out, opts, sets)
    assert trained == []  # refused, not continued under the new schedule


def test_eval_names_its_default_out_after_the_model():
    from downstream.cli import default_out

    assert default_out("runs/bert-tiny/", True, None) == os.path.join("eval", "bert-tiny")
    assert default_out("runs/a/checkpoints/step_00000100", True, None) == os.path.join("eval", "a-step_00000100")
    assert default_out("runs/b/checkpoints/step_00000100", False, "whiten") == os.path.join(
        "eval", "b-step_00000100-scratch-whiten")  # two runs' checkpoints of one step do not share a directory


def test_compare_names_families_at_a_size():
    from downstream import cli

    assert cli._presets(["gpt", "bert", "t5-small"], "tiny") == ["gpt-tiny", "bert-tiny", "t5-small"]
    assert cli._presets(["gpt"], None) == ["gpt"]  # GPT (2018) itself
    with pytest.raises(TaskError, match=r"'nope-tiny' is not a preset \("):
        cli._presets(["nope"], "tiny")
    with pytest.raises(TaskError, match=r"'bret-tiny' is not a preset \(did you mean bert-tiny\?\)"):
        cli._presets(["bret"], "tiny")


def test_compare_with_a_mistyped_set_is_one_line(train_data, task_dir, tmp_path, capsys):
    from downstream import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(["compare", "bert-tiny", "--data", train_data, "--task", str(task_dir / "next"), "--budget",
                  "tokens=2e4", "--out", str(tmp_path / "cmp"), "--set", "data.seqlen=64"])
    assert stop.value.code == 2 and capsys.readouterr().err.startswith(
        "downstream: error: --set data.seqlen=64: unknown key 'data.seqlen'")


def _compare_training(tmp_path, on_term: str = "") -> tuple[subprocess.Popen, int]:
    """A `ptm compare` (its `_train`, SIGTERM its Ctrl-C) whose pretraining is a stand-in that runs `on_term` on
    SIGTERM, once that has started: the compare's process and the stand-in's pid."""
    import time

    pid_file = tmp_path / "trainer.pid"
    trainer = (f"import os, signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: ({on_term or 'sys.exit(143)'}))"
               f"\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)")
    compare = ("import sys\nfrom ptm.cli import stop_on_sigterm\nfrom downstream.compare import _train\n"
               f"stop_on_sigterm()\ntry:\n    _train('bert-tiny', [], [sys.executable, '-c', {trainer!r}], "
               f"{str(tmp_path)!r})\nexcept KeyboardInterrupt as e:\n    sys.exit(getattr(e, 'status', 130))")
    parent = subprocess.Popen([sys.executable, "-c", compare], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)  # (a process group of its own, as a terminal's command has)
    for _ in range(600):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.1)
    return parent, int(pid_file.read_text())


def test_a_pretraining_ends_with_the_compare_that_started_it(tmp_path):
    """`ptm compare` killed outright (SIGKILL): the pretraining it started ends too, instead of writing on beside
    the one a re-run starts in the same cell."""
    import signal
    import time

    parent, child = _compare_training(tmp_path)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the pretraining outlived the compare that started it")


def test_a_stopped_compare_lets_its_pretraining_checkpoint_first(tmp_path):
    """`ptm compare` stopped (SIGTERM: kill, scancel; Ctrl-C at its terminal, to its process group): it passes the
    stop to its pretraining (in a session of its own: Ctrl-C does not end it where it is) and waits while that
    checkpoints and ends, instead of killing it (subprocess.run's SIGKILL) and losing the steps since the last periodic
    checkpoint."""
    import signal

    for signum, status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        done = tmp_path / f"checkpointed-{signum}"
        parent, _ = _compare_training(tmp_path, f"time.sleep(1), open({str(done)!r}, 'w').write('75'), sys.exit(75)")
        os.killpg(parent.pid, signum)
        assert parent.wait(60) == status and done.exists(), parent.stderr.read()
        assert parent.stderr.read().splitlines() == ["downstream: stopping: the pretraining of bert-tiny checkpoints "
                                                     "where it is (Ctrl-C again ends it at once)"]
        (tmp_path / "trainer.pid").unlink()
