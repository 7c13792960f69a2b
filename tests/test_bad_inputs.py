"""Bad inputs, tried as a new user would: every command that takes a path, given another family's run, an empty
directory, a random or truncated file, or another tool's directory, ends with one line naming the thing and the fix,
a non-zero exit status and no traceback. The runs are built once (untrained weights are enough to convert) and
damaged copy by copy; the commands run in this process (their `main`), but for a few through the real CLI."""
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import types

import pytest

from conftest import ROOT, run_cli

COMMON = ["data.seq_len=32", "model.max_position_embeddings=32", "train.global_batch_size=8",
          "train.micro_batch_size=8", "train.steps=1", "train.eval_interval=0", "checkpoint.interval=0",
          "data.num_workers=0", "data.valid_fraction=0.02", "optimizer.warmup_steps=1"]


def _run(out: str, preset: str, tok_dir: str, overrides: tuple = ()) -> str:
    """A run directory holding one checkpoint of `preset`'s model (with `overrides`), freshly initialised, with the
    tokenizer."""
    import torch

    from data_prep.tokenizer import load_tokenizer
    from pretrain import checkpoint as C
    from pretrain import models
    from pretrain.config import load
    from pretrain.parallel import mcore

    cfg = load(preset, [f"model.vocab_size={load_tokenizer(tok_dir).vocab_size}", *overrides]).model
    torch.manual_seed(0)
    model = models.build(cfg, tp=mcore.OneRank())
    ckpt = os.path.join(out, "checkpoints", "step_00000001")
    C.save_model(ckpt, model.state_dict())
    C.copy_tokenizer(tok_dir, ckpt)
    C.write_meta(ckpt, model=cfg, params=C.param_info(model.named_parameters()), step=1)
    C.mark_latest(out, "step_00000001")
    return out


def _truncate(path: str, size: int) -> str:
    with open(path, "r+b") as f:
        f.truncate(size)
    return path


@pytest.fixture(scope="module")
def w(small, train_data, sp_model, words_data, tmp_path_factory):
    """Runs of three families (BERT, GPT-2, ELMo; a GPT-2 on words), their exports, a dataset, and damaged or foreign
    copies of each."""
    from checkpoints_tools.bilm_tf import to_elmo
    from checkpoints_tools.hf import to_hf

    root = str(tmp_path_factory.mktemp("bad_inputs"))
    at = types.SimpleNamespace(root=root)

    def copy(source: str, name: str) -> str:
        return shutil.copytree(source, os.path.join(root, name))

    def write(path: str, data: bytes) -> str:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        return path

    for family in ("bert", "gpt2", "elmo"):
        setattr(at, family, _run(os.path.join(root, family), f"{family}-tiny", sp_model))
    at.gpt2_words = _run(os.path.join(root, "gpt2_words"), "gpt2-tiny", os.path.join(words_data, "tokenizer"))
    at.xlnet_dropouts = _run(os.path.join(root, "xlnet_dropouts"), "xlnet-tiny", sp_model,
                             ["model.hidden_dropout=0.1", "model.attention_dropout=0.0"])
    at.hf = to_hf(at.bert, os.path.join(root, "hf"))
    at.elmo_files = to_elmo(at.elmo, os.path.join(root, "elmo_files"))
    write(os.path.join(at.elmo_files, "vocab.txt"), "".join(f"w{i}\n" for i in range(100)).encode())  # any words
    noise = os.urandom(4096)
    at.empty = copy(os.path.join(root, "hf"), "empty")
    for name in os.listdir(at.empty):
        os.remove(os.path.join(at.empty, name))
    at.random_file = write(os.path.join(root, "random.bin"), noise)
    at.random_meta = os.path.dirname(write(os.path.join(root, "random_meta", "meta.json"), noise))
    step = os.path.join("checkpoints", "step_00000001")
    at.cut_shard = copy(at.bert, "cut_shard")
    _truncate(os.path.join(at.cut_shard, step, "shards", "param-tp00-dp000.safetensors"), 1000)
    at.cut_meta = copy(at.bert, "cut_meta")
    _truncate(os.path.join(at.cut_meta, step, "meta.json"), 200)
    at.stale_latest = copy(at.bert, "stale_latest")
    write(os.path.join(at.stale_latest, "checkpoints", "latest"), b"step_00000099\n")
    at.hf_cut_weights = copy(at.hf, "hf_cut_weights")
    _truncate(os.path.join(at.hf_cut_weights, "model.safetensors"), 5000)
    at.hf_other_tokenizer = copy(at.hf, "hf_other_tokenizer")  # as many words, another tokenizer
    meta = json.load(open(os.path.join(at.hf, "ptm_tokenizer.json")))
    write(os.path.join(at.hf_other_tokenizer, "ptm_tokenizer.json"), json.dumps({**meta, "sha256": "0" * 64}).encode())
    at.hf_cut_config = copy(at.hf, "hf_cut_config")
    _truncate(os.path.join(at.hf_cut_config, "config.json"), 40)
    at.hf_no_weights = copy(at.hf, "hf_no_weights")
    os.remove(os.path.join(at.hf_no_weights, "model.safetensors"))
    at.hf_llama = copy(at.hf, "hf_llama")
    config = json.load(open(os.path.join(at.hf, "config.json")))
    write(os.path.join(at.hf_llama, "config.json"), json.dumps({**config, "model_type": "llama"}).encode())
    at.elmo_cut_weights = copy(at.elmo_files, "elmo_cut_weights")
    _truncate(os.path.join(at.elmo_cut_weights, "weights.hdf5"), 2000)
    at.elmo_random_weights = copy(at.elmo_files, "elmo_random_weights")
    write(os.path.join(at.elmo_random_weights, "weights.hdf5"), noise)
    at.elmo_cut_options = copy(at.elmo_files, "elmo_cut_options")
    _truncate(os.path.join(at.elmo_cut_options, "options.json"), 30)
    at.elmo_hf_options = copy(at.elmo_files, "elmo_hf_options")  # a transformers config.json where options.json goes
    shutil.copy(os.path.join(at.hf, "config.json"), os.path.join(at.elmo_hf_options, "options.json"))
    at.elmo_other_options = copy(at.elmo_files, "elmo_other_options")  # another model's options: one layer more
    options = json.load(open(os.path.join(at.elmo_files, "options.json")))
    options["lstm"]["n_layers"] += 1
    write(os.path.join(at.elmo_other_options, "options.json"), json.dumps(options).encode())
    at.data, at.text = train_data, small["path"]
    at.data_cut_manifest = copy(train_data, "data_cut_manifest")
    _truncate(os.path.join(at.data_cut_manifest, "manifest.json"), 100)
    at.data_foreign = copy(train_data, "data_foreign")  # a web app's manifest.json
    write(os.path.join(at.data_foreign, "manifest.json"), b'{"name": "app", "icons": []}')
    at.data_list = copy(train_data, "data_list")  # another tool's, a list
    write(os.path.join(at.data_list, "manifest.json"), b'[{"file": "a.js"}]')
    at.data_cut_shard = copy(train_data, "data_cut_shard")
    shard = next(n for n in sorted(os.listdir(at.data_cut_shard)) if n.endswith(".arrow"))
    _truncate(os.path.join(at.data_cut_shard, shard), 3000)
    at.cut_spm = os.path.join(copy(sp_model, "cut_spm"), "spm.model")
    _truncate(at.cut_spm, 500)
    at.cut_tokenizer_meta = copy(sp_model, "cut_tokenizer_meta")
    _truncate(os.path.join(at.cut_tokenizer_meta, "ptm_tokenizer.json"), 20)
    at.log_broken = copy(at.empty, "log_broken")
    write(os.path.join(at.log_broken, "metrics.jsonl"), b'{"step": 1, "loss": 9.0}\n<html>\n{"step": 3, "loss": 8.0}\n')
    at.log_cut = copy(at.empty, "log_cut")  # killed while writing its last row
    write(os.path.join(at.log_cut, "metrics.jsonl"),
          b'{"step": 1, "loss": 9.0}\n{"step": 2, "loss": 8.5}\n{"step": 3, "lo')
    at.out = os.path.join(root, "out")  # where a command that should fail would write
    return at


def error_line(capsys, main, argv: list) -> str:
    """The one error line `main(argv)` ends with; it must exit non-zero and raise nothing but SystemExit."""
    with pytest.raises(SystemExit) as ended:
        main([str(a) for a in argv])
    code = ended.value.code
    said = capsys.readouterr().err + (f"{code}\n" if isinstance(code, str) else "")
    errors = [line for line in said.splitlines() if ": error: " in line]
    assert code == 2 and len(errors) == 1, said
    return errors[0]


def _convert(argv):
    from checkpoints_tools.cli import main

    main(argv)


def _pretrain(argv):
    from pretrain.cli import main

    main(argv)


def _downstream(argv):
    from downstream.cli import main

    main(argv)


def _prep(argv):
    from data_prep.cli import main

    main(argv)


# (command, its arguments from the fixture's paths, what the line must say besides the path it names (first))
CASES = {
    "to-hf an ELMo run": (_convert, lambda w: [w.elmo, "to-hf", w.elmo, "--out", w.out],
                          ["model.arch=elmo", "no Hugging Face class", "ptm convert to-elmo"]),
    "to-hf a GPT-2 trained on words": (_convert, lambda w: [w.gpt2_words, "to-hf", w.gpt2_words, "--out", w.out],
                                       ["was trained on words", "train it on a `data_prep build` dataset"]),
    "to-hf an XLNet with two dropouts": (_convert, lambda w: [w.xlnet_dropouts, "to-hf", w.xlnet_dropouts, "--out",
                                                              w.out],
                                         ["XLNetConfig has one dropout", "set them equal"]),
    "to-hf an empty directory": (_convert, lambda w: [w.empty, "to-hf", w.empty, "--out", w.out],
                                 ["neither a ptm checkpoint", "pass a checkpoint directory or a training out_dir"]),
    "to-hf a random file": (_convert, lambda w: [w.random_file, "to-hf", w.random_file, "--out", w.out],
                            ["neither a ptm checkpoint"]),
    "to-hf a Hugging Face directory": (_convert, lambda w: [w.hf, "to-hf", w.hf, "--out", w.out],
                                       ["neither a ptm checkpoint"]),
    "to-hf a binary meta.json": (_convert, lambda w: [w.random_meta, "to-hf", w.random_meta, "--out", w.out],
                                 ["meta.json is unreadable", "use another one"]),
    "to-hf a truncated meta.json": (_convert, lambda w: [w.cut_meta, "to-hf", w.cut_meta, "--out", w.out],
                                    ["meta.json is unreadable", "use another one"]),
    "to-hf a truncated shard": (_convert, lambda w: [w.cut_shard, "to-hf", w.cut_shard, "--out", w.out],
                                ["param-tp00-dp000.safetensors has 1000 bytes", "an earlier step_N"]),
    "to-hf a run whose latest is gone": (_convert, lambda w: [w.stale_latest, "to-hf", w.stale_latest, "--out", w.out],
                                         ["checkpoints/latest names 'step_00000099'", "step_N"]),
    "to-hf onto a file": (_convert, lambda w: [w.random_file, "to-hf", w.bert, "--out", w.random_file],
                          ["is a file", "pass a directory"]),
    "consolidate into a run": (_convert, lambda w: [w.gpt2, "consolidate", w.bert, "--out", w.gpt2],
                               ["is a directory that is not empty", "choose another --out"]),
    "consolidate a truncated shard": (_convert, lambda w: [w.cut_shard, "consolidate", w.cut_shard, "--out", w.out],
                                      ["truncated", "an earlier step_N"]),
    "to-hf with a shard size that is none": (_convert, lambda w: ["'1 gig'", "to-hf", w.bert, "--out", w.out,
                                                                  "--max-shard-size", "1 gig"], ["2GB, 500MB"]),
    "reshard into 0": (_convert, lambda w: ["'0'", "reshard", w.bert, "--out", w.out, "--tp", "0"],
                       ["not a tensor-parallel size"]),
    "reshard into 3": (_convert, lambda w: ["tp=3", "reshard", w.bert, "--out", w.out, "--tp", "3"],
                       ["not divisible", "choose a --tp"]),
    "to-elmo a BERT run": (_convert, lambda w: [w.bert, "to-elmo", w.bert, "--out", w.out],
                           ["model.arch=bert", "use to-hf"]),
    "to-elmo a GPT-2 run": (_convert, lambda w: [w.gpt2, "to-elmo", w.gpt2, "--out", w.out],
                            ["model.arch=gpt2", "use to-hf"]),
    "to-elmo a truncated shard": (_convert, lambda w: [w.cut_shard, "to-elmo", w.cut_shard, "--out", w.out],
                                  ["truncated", "an earlier step_N"]),
    "from-hf an empty directory": (_convert, lambda w: [w.empty, "from-hf", w.empty, "--out", w.out],
                                   ["has no config.json", "save_pretrained"]),
    "from-hf a random file": (_convert, lambda w: [w.random_file, "from-hf", w.random_file, "--out", w.out],
                              ["is not a directory", "save_pretrained"]),
    "from-hf a ptm run": (_convert, lambda w: [w.bert, "from-hf", w.bert, "--out", w.out], ["has no config.json"]),
    "from-hf truncated weights": (_convert, lambda w: [w.hf_cut_weights, "from-hf", w.hf_cut_weights, "--out", w.out],
                                  ["cannot load the weights", "download it again"]),
    "from-hf a truncated config.json": (_convert, lambda w: [w.hf_cut_config, "from-hf", w.hf_cut_config, "--out",
                                                             w.out], ["config.json is not a readable config",
                                                                      "download it again"]),
    "from-hf without weights": (_convert, lambda w: [w.hf_no_weights, "from-hf", w.hf_no_weights, "--out", w.out],
                                ["no weights (model.safetensors or pytorch_model.bin)", "the whole directory"]),
    "from-hf another model type": (_convert, lambda w: ["'llama'", "from-hf", w.hf_llama, "--out", w.out],
                                   ["is not supported", "ptm imports bert"]),
    "from-elmo an empty directory": (_convert, lambda w: [w.empty, "from-elmo", w.empty, "--out", w.out],
                                     ["has no options.json", "to-elmo"]),
    "from-elmo a ptm ELMo run": (_convert, lambda w: [w.elmo, "from-elmo", w.elmo, "--out", w.out],
                                 ["has no options.json", "to-elmo"]),
    "from-elmo truncated weights.hdf5": (_convert, lambda w: [os.path.join(w.elmo_cut_weights, "weights.hdf5"),
                                                              "from-elmo", w.elmo_cut_weights, "--out", w.out],
                                         ["truncated file", "export it again"]),
    "from-elmo random weights.hdf5": (_convert, lambda w: [os.path.join(w.elmo_random_weights, "weights.hdf5"),
                                                           "from-elmo", w.elmo_random_weights, "--out", w.out],
                                      ["not a readable HDF5 file", "export it again"]),
    "from-elmo truncated options.json": (_convert, lambda w: [os.path.join(w.elmo_cut_options, "options.json"),
                                                              "from-elmo", w.elmo_cut_options, "--out", w.out],
                                         ["is unreadable", "export it again"]),
    "from-elmo a transformers config as options.json": (
        _convert, lambda w: [os.path.join(w.elmo_hf_options, "options.json"), "from-elmo", w.elmo_hf_options, "--out",
                             w.out], ["has no 'lstm'", "the options.json that came with weights.hdf5"]),
    "from-elmo another model's options.json": (
        _convert, lambda w: [os.path.join(w.elmo_other_options, "weights.hdf5"), "from-elmo", w.elmo_other_options,
                             "--out", w.out], ["has no RNN_0/RNN/MultiRNNCell/Cell2", "exported together"]),
    "plan on no nodes": (_pretrain, lambda w: ["'0'", "plan", "--config", "bert-tiny", "--gpu", "h100", "--nodes", "0"],
                         ["is not a count (1, 2, ...)"]),
    "elmo on a BERT run": (_pretrain, lambda w: [w.bert, "elmo", w.bert, "--text", "a b"],
                           ["model.arch=bert, not an ELMo", "options.json + weights.hdf5"]),
    "elmo on a GPT-2 run": (_pretrain, lambda w: [w.gpt2, "elmo", w.gpt2, "--text", "a b"],
                            ["model.arch=gpt2, not an ELMo", "an ELMo checkpoint or run"]),
    "elmo on an empty directory": (_pretrain, lambda w: [w.empty, "elmo", w.empty, "--text", "a"],
                                   ["holds no ELMo", "an ELMo checkpoint or run"]),
    "elmo on truncated weights.hdf5": (_pretrain, lambda w: [w.elmo_cut_weights, "elmo", w.elmo_cut_weights, "--text",
                                                             "a"], ["weights.hdf5 is not a readable", "export it"]),
    "elmo on a truncated shard": (_pretrain, lambda w: [w.cut_shard, "elmo", w.cut_shard, "--text", "a"],
                                  ["truncated", "an earlier step_N"]),
    "report an empty directory": (_pretrain, lambda w: [w.empty, "report", w.empty],
                                  ["metrics.jsonl is missing or empty", "a run's out_dir"]),
    "report a log with a foreign line": (_pretrain, lambda w: [w.log_broken, "report", w.log_broken],
                                         ["metrics.jsonl:2 is not a ptm log row", "remove that line"]),
    "report into a missing directory": (_pretrain, lambda w: [w.root, "report", w.log_cut, "--out",
                                                              os.path.join(w.root, "no", "r.png")],
                                        ["directory does not exist", "create it"]),
    "build a vocabulary of none": (_prep, lambda w: ["'0'", "build", w.empty, "--out", w.out, "--vocab-size", "0"],
                                   ["is not a number of pieces"]),
    "inspect an empty directory": (_prep, lambda w: [w.empty, "inspect", w.empty],
                                   ["no manifest.json", "data_prep build"]),
    "inspect a truncated manifest": (_prep, lambda w: [w.data_cut_manifest, "inspect", w.data_cut_manifest],
                                     ["manifest.json is unreadable", "data_prep verify"]),
    "inspect another tool's manifest": (_prep, lambda w: [w.data_foreign, "inspect", w.data_foreign],
                                        ["not a ptm dataset's manifest", "data_prep build"]),
    "inspect a truncated shard": (_prep, lambda w: [w.data_cut_shard, "inspect", w.data_cut_shard],
                                  ["truncated", "data_prep verify"]),
    "words of a truncated manifest": (_prep, lambda w: [w.data_cut_manifest, "words", w.data_cut_manifest, "--out",
                                                        w.out], ["manifest.json is unreadable", "rebuild it"]),
    "words of a checkpoint": (_prep, lambda w: [w.bert, "words", w.bert, "--out", w.out],
                              ["not a finished ptm dataset", "data_prep build"]),
    "build with a truncated spm.model": (_prep, lambda w: [w.cut_spm, "build", w.text, "--out", w.out,
                                                           "--tokenizer", w.cut_spm],
                                         ["the tokenizer does not load", "pass another tokenizer"]),
    "build with a truncated ptm_tokenizer.json": (
        _prep, lambda w: [w.cut_tokenizer_meta, "build", w.text, "--out", w.out, "--tokenizer",
                          w.cut_tokenizer_meta],
        ["ptm_tokenizer.json: the tokenizer does not load", "copy or rebuild"]),
    "build a missing input": (_prep, lambda w: [os.path.join(w.root, "nothing.txt"), "build",
                                                os.path.join(w.root, "nothing.txt"), "--out", w.out],
                              ["input not found", "check the path"]),
    "build with an entity file that is not text": (_prep, lambda w: [w.random_file, "build", w.text, "--out", w.out,
                                                                     "--entities", w.random_file],
                                                   ["is not UTF-8", "convert it to UTF-8"]),
    "train a tokenizer into a file": (_prep, lambda w: [w.random_file, "train-tokenizer", w.text, "--out",
                                                        w.random_file], ["is a file", "choose another --out"]),
    "plan for a GPU of no memory": (_pretrain, lambda w: ["'0'", "plan", "--config", "bert-tiny", "--gpu-memory", "0"],
                                    ["is not a size in GiB"]),
    "eval into a file": (_downstream, lambda w: [w.random_file, "eval", w.hf, "--task", w.empty, "--out",
                                                 w.random_file], ["is a file", "a directory for the results"]),
    "compare at a budget of no end": (_downstream, lambda w: ["flops=inf", "compare", "bert-tiny", "--data", w.empty,
                                                              "--task", w.empty, "--budget", "flops=inf", "--out",
                                                              w.out], ["a finite number above 0"]),
    "tasks of a directory without the corpus": (_downstream, lambda w: [w.empty, "tasks", "--out", w.out, "--corpus",
                                                                        w.empty], ["has no en.jsonl",
                                                                                   "ptm prep corpus --out"]),
}


@pytest.mark.parametrize("case", CASES)
def test_one_line_naming_the_thing_and_the_fix(case, w, capsys):
    """Each case ends with SystemExit(non-zero) and one `...: error:` line that names the path (or value) at fault and
    says what to do; nothing is written where the command would have written (but a build's .partial/, which the
    same command resumes)."""
    main, argv, says = CASES[case]
    named, *args = argv(w)
    line = error_line(capsys, main, args)
    written = os.path.exists(w.out)
    shutil.rmtree(w.out, ignore_errors=True)
    assert str(named) in line and all(s in line for s in says), line
    assert not written or args[0] == "build"


def test_the_undamaged_originals_pass(w, capsys):
    """What the damaged copies came from converts and embeds: the checks refuse only what is wrong."""
    from checkpoints_tools.cli import main as convert
    from pretrain.cli import main as pretrain

    for argv in (["from-hf", w.hf, "--out", f"{w.out}/hf"], ["from-elmo", w.elmo_files, "--out", f"{w.out}/elmo"],
                 ["consolidate", w.bert, "--out", f"{w.out}/bert"], ["to-hf", w.gpt2, "--out", f"{w.out}/gpt2"]):
        convert(argv)
    pretrain(["elmo", w.elmo, "--text", "a b"])
    pretrain(["elmo", w.elmo_files, "--text", "a b"])
    said = capsys.readouterr()
    shutil.rmtree(w.out)
    assert said.out.count("wrote ") == 4 and said.out.count("layer 2") == 2 and "error" not in said.err


def test_elmo_on_a_gpt2_run_through_the_real_cli(w):
    """`ptm elmo` on a GPT-2 run, as a user types it: exit status non-zero, one line, no traceback."""
    proc = run_cli("pretrain", "elmo", w.gpt2, "--text", "Return the value .", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"pretrain: error: {w.gpt2}/checkpoints/step_00000001 holds "
                                                f"model.arch=gpt2, not an ELMo; pass an ELMo checkpoint or run "
                                                f"(model.arch=elmo), or a directory of bilm-tf's options.json + "
                                                f"weights.hdf5 (`ptm convert to-elmo`)"]


STOP_AT = ("import importlib, os, runpy, sys; where, name = sys.argv[1].rsplit('.', 1); signum = int(sys.argv[2]); "
           "setattr(importlib.import_module(where), name, lambda *_, **__: os.kill(os.getpid(), signum)); "
           "sys.argv = sys.argv[3:]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def _command(argv: list, limit: int = 0, stop: tuple = ()) -> subprocess.CompletedProcess:
    """`python -m ARGV...` with files limited to `limit` bytes (RLIMIT_FSIZE: EFBIG, as a full disk's ENOSPC), or
    sent signal `stop[1]` by itself where it calls `stop[0]` (module.function)."""
    cmd = [sys.executable, *(["-c", STOP_AT, stop[0], str(int(stop[1]))] if stop else ["-m"]), *map(str, argv)]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=lambda: limit and (
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))))


def test_a_full_disk_or_a_stop_signal_in_convert_is_one_line_leaving_nothing_partial(w, tmp_path):
    """A refused write (a full disk), Ctrl-C and SIGTERM in `ptm convert`: one line naming what happened and what to
    do, the status (2, 130, 143), and no half-written output (OUT.tmp, OUT's weights.hdf5.partial)."""
    out = tmp_path / "out"
    full = _command(["checkpoints_tools", "to-elmo", w.elmo, "--out", out], limit=20_000)
    assert full.returncode == 2 and full.stderr.splitlines() == [
        f"checkpoints_tools: error: cannot write {out}.tmp/weights.hdf5: File too large; free space there (or "
        "raise the quota) and re-run the same command"], full.stderr
    for signum, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        stopped = _command(["checkpoints_tools", "to-hf", w.bert, "--out", out],
                       stop=("checkpoints_tools.hf.export_tokenizer", signum))  # (the weights are written)
        assert stopped.returncode == status and stopped.stderr.splitlines()[-1:] == [
            f"checkpoints_tools: interrupted; nothing was written to {out}: re-run the same command"], stopped.stderr
    assert os.listdir(tmp_path) == []


def test_a_full_disk_or_a_stop_signal_in_eval_is_one_line_leaving_nothing_partial(w, tmp_path):
    """A refused write (a full disk) and SIGTERM in `ptm eval`: one line naming what happened and what to do, the
    status (2, 143), and no half-written model (--save-model's config.json without its weights)."""
    out = tmp_path / "out"
    task = tmp_path / "sst2"
    task.mkdir()
    for split in ("train", "dev"):
        (task / f"{split}.tsv").write_text("sentence\tlabel\n" + "a fine text\t1\nnot so good\t0\n" * 4)
    evaluate = ["downstream", "eval", w.hf, "--task", f"sst2={task}", "--out", out, "--epochs", "1", "--seeds", "1",
                "--lrs", "1e-3", "--batch-size", "4", "--max-len", "16", "--no-progress"]
    full = _command(evaluate + ["--save-model"], limit=200_000)  # (the results fit, the model does not)
    assert full.returncode == 2 and full.stderr.splitlines()[-1] == (
        f"downstream: error: cannot write {out}/models/sst2.tmp: File too large; free space there "
        "(or raise the quota) and re-run the same command (what finished is kept)"), full.stderr
    assert "Traceback" not in full.stderr and os.listdir(out / "models") == []
    stopped = _command(evaluate, stop=("downstream.finetune.run_one", signal.SIGTERM))
    assert stopped.returncode == 143 and stopped.stderr.splitlines() == [
        "downstream: interrupted; re-run the same command (what finished is kept)"], stopped.stderr


def test_a_checkpoint_memory_cannot_map_is_not_called_damaged(w, capsys, monkeypatch):
    """A shard that mmap was refused (ENOMEM: a memory limit) is not called damaged (its user would delete it)."""
    from pretrain import checkpoint as C

    def refused(path, **_):
        raise OSError(f"unable to mmap 1000 bytes from file <{path}>: Cannot allocate memory (12)")

    monkeypatch.setattr(C, "safe_open", refused)
    line = error_line(capsys, _convert, ["to-hf", w.bert, "--out", w.out])
    assert "could not be mapped: host memory ran out" in line and "damaged" not in line, line
    assert not os.path.exists(w.out)


@pytest.mark.parametrize("dataset", ["data_foreign", "data_list"])
def test_verify_names_another_tools_manifest(dataset, w, capsys):
    """`data_prep verify` on a directory whose manifest.json is another tool's: INVALID, naming the file; exit 1."""
    from data_prep.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["verify", getattr(w, dataset)])
    said = capsys.readouterr().out
    assert ended.value.code == 1 and f"{getattr(w, dataset)}/manifest.json: unreadable manifest (" in said


def test_report_leaves_out_a_last_row_cut_short(w, capsys):
    """A run killed while writing its log: the report plots the whole rows."""
    from pretrain.report import log_rows, report

    assert [r["step"] for r in log_rows(os.path.join(w.log_cut, "metrics.jsonl"))] == [1, 2]
    assert os.path.isfile(report(w.log_cut))


@pytest.mark.parametrize("setting, says", [
    ("checkpoint.init_from={random_meta}", "{random_meta}/meta.json is unreadable ('utf-8' codec can't decode"),
    ("distill.teacher={hf_cut_weights}", "{hf_cut_weights}: transformers cannot load the weights"),
    ("distill.teacher={hf_other_tokenizer}", "{hf_other_tokenizer} has another tokenizer (sha256 000000000000)"),
])
def test_train_names_a_damaged_path_it_starts_from(setting, says, w):
    """`ptm train` from a damaged checkpoint, or distilling a Hugging Face BERT whose weights are truncated: one line,
    exit status 2 (a teacher's config.json is read by from-hf's code, tried above)."""
    paths = vars(w)
    student = ["--config", "distilbert-tiny", "--set", "distill.init_from_teacher=false"] if "teacher" in setting \
        else ["--config", "bert-tiny", "--set"]
    proc = run_cli("pretrain", "train", *student, f"data.path={w.data}", *COMMON, f"out_dir={w.root}/train",
                   setting.format(**paths), check=False)
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower() or "Traceback" in line]
    assert proc.returncode == 2 and len(errors) == 1 and says.format(**paths) in errors[0], proc.stderr[-3000:]
