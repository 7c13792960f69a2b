"""Determinism across workers and partitions, crash safety and resume, verify, and input errors."""
import gzip
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import ROOT, run_cli, write_jsonl
from data_prep import PrepError
from helpers import contents, quick_build


@pytest.fixture(scope="module")
def three_files(corpus, tmp_path_factory):
    """Three inputs with exact duplicates inside and across files."""
    d = tmp_path_factory.mktemp("three")
    en, zh = corpus["en"], corpus["zh"]
    write_jsonl(d / "a.jsonl", [{"text": t} for t in en[:150] + zh[:150] + en[:5]])
    write_jsonl(d / "b.jsonl", [{"text": t} for t in zh[150:350] + en[10:20] + en[150:250]])
    write_jsonl(d / "c.jsonl", [{"text": t} for t in zh[300:320] + zh[350:500]])
    return [str(d / f) for f in ("a.jsonl", "b.jsonl", "c.jsonl")]


@pytest.fixture(scope="module")
def reference(three_files, sp_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "ds"
    m = quick_build(three_files, out, tokenizer=sp_model, shard_size=32 << 10)
    return {"manifest": m, "contents": contents(out)}


def test_reference_dedups_within_and_across_files(reference, three_files):
    from conftest import read_jsonl
    from data_prep.text import TextOptions, normalize

    texts = [normalize(r["text"], TextOptions()) for f in three_files for r in read_jsonl(f)]
    s = reference["manifest"]["stats"]
    assert s["records"] == 305 + 310 + 170 == len(texts)
    assert s["duplicates"] == len(texts) - len(set(texts)) >= 5 + 10 + 20
    assert reference["manifest"]["num_documents"] == len(set(texts))


@pytest.mark.parametrize("workers,partitions", [(2, 1), (1, 3), (2, 2)])
def test_same_documents_whatever_workers_and_partitions(workers, partitions, three_files, sp_model, reference, tmp_path):
    m = quick_build(three_files, tmp_path / "ds", tokenizer=sp_model, workers=workers, num_partitions=partitions,
                    shard_size=20 << 10)
    assert contents(tmp_path / "ds") == reference["contents"]
    assert m["stats"]["duplicates"] == reference["manifest"]["stats"]["duplicates"]
    assert m["num_partitions"] == partitions


def test_partitions_are_contiguous_runs_of_about_equal_bytes(tmp_path):
    """A file goes where its middle byte falls: two files of about equal size are not both given to partition 0,
    and no partition is left without a file while there are enough."""
    from data_prep.build import partition_files

    def parts(sizes, k):
        files = []
        for i, n in enumerate(sizes):
            (tmp_path / f"f{i}").write_bytes(b"x" * n)
            files.append(str(tmp_path / f"f{i}"))
        out = partition_files(files, k)
        assert [f for _, fs in out for f in fs] == files and all(files[i:i + len(fs)] == fs for i, fs in out if fs)
        return [len(fs) for _, fs in out]

    assert parts([1000, 1001], 2) == [1, 1] and parts([1000, 1001, 1001, 1001], 4) == [1, 1, 1, 1]
    assert parts([194, 354], 2) == [1, 1] and parts([100, 1, 1], 3) == [1, 1, 1]
    assert parts([10] + [1] * 10, 2) == [1, 10] and parts([1] * 7, 3) == [2, 3, 2]


@pytest.mark.distributed
def test_partitions_as_separate_jobs_then_finalize(three_files, sp_model, reference, tmp_path):
    out = tmp_path / "ds"
    common = ["data_prep", "build", *three_files, "--out", out, "--tokenizer", sp_model, "--num-partitions", 3,
              "--no-progress"]
    procs = [subprocess.Popen([sys.executable, "-m", *map(str, common), "--partition", str(p)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in (2, 0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert run_cli("data_prep", "verify", out, check=False).returncode == 1  # no manifest until finalize
    # a partition built again with other options says so, and finalize names the partitions left of the old ones
    again = run_cli(*common, "--partition", 1, "--min-chars", 50)
    assert "min_chars 1 -> 50" in again.stderr and "not reused; build every partition with these" in again.stderr
    assert "partitions 0, 2 of" in _error("finalize", out)
    run_cli(*common, "--partition", 1)
    run_cli("data_prep", "finalize", out)
    assert run_cli("data_prep", "verify", out).returncode == 0
    assert contents(out) == reference["contents"]


def test_finalize_cut_short_then_run_again(three_files, sp_model, reference, tmp_path, monkeypatch):
    """finalize rewrites shards that lose documents to earlier partitions' duplicates: cut short after one rewrite,
    then before the manifest, then after it (before .partial/ goes), each run again ends in the reference dataset
    with its duplicate count, and `verify` passes."""
    import data_prep.build as B
    from data_prep.verify import verify

    out = tmp_path / "ds"
    quick_build(three_files, out, tokenizer=sp_model, num_partitions=3, shard_size=20 << 10, partition=0)
    for p in (1, 2):
        quick_build(three_files, out, tokenizer=sp_model, num_partitions=3, shard_size=20 << 10, partition=p)

    def crash(fn, before=False):
        def wrapped(path, *args):
            if before and path.endswith("manifest.json"):
                raise KeyboardInterrupt
            fn(path, *args)
            if not before:
                raise KeyboardInterrupt
        return wrapped

    monkeypatch.setattr(B, "write_table_atomic", crash(B.write_table_atomic))  # after one shard's rewrite
    with pytest.raises(KeyboardInterrupt):
        B.finalize(str(out))
    monkeypatch.undo()
    monkeypatch.setattr(B, "write_json", crash(B.write_json, before=True))  # after every rewrite, before the manifest
    with pytest.raises(KeyboardInterrupt):
        B.finalize(str(out))
    monkeypatch.undo()
    monkeypatch.setattr(B, "_finished", lambda out: None)
    m = B.finalize(str(out))
    assert verify(str(out)) == [f"{out}: .partial/ present: a build is still writing here, or its end was cut short "
                                "(re-run the build or `finalize` to finish it)"]
    monkeypatch.undo()
    again = B.finalize(str(out))
    assert {**again, "created": m["created"]} == m and verify(str(out)) == []
    assert contents(out) == reference["contents"]
    assert m["stats"]["duplicates"] == reference["manifest"]["stats"]["duplicates"]


@pytest.mark.distributed
def test_mpirun_builds_partitions_per_rank(three_files, sp_model, reference, tmp_path):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("Open MPI (mpirun) not installed (scripts/setup.sh installs it)")
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, "-m", "data_prep", "build",
           *three_files, "--out", str(tmp_path / "ds"), "--tokenizer", sp_model, "--no-progress"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    m = json.load(open(tmp_path / "ds" / "manifest.json"))
    assert m["num_partitions"] == 2
    assert contents(tmp_path / "ds") == reference["contents"]
    # rank 0 stops (other options than the finished dataset's): rank 1 hears of it instead of waiting for it
    proc = subprocess.run([*cmd, "--min-chars", "400"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "already holds a finished dataset" in proc.stderr, proc.stderr
    assert "data_prep: error: rank 0 stopped: " in proc.stderr, proc.stderr


def _shards(out):
    return sorted(f for f in os.listdir(out) if f.endswith(".arrow")) if os.path.isdir(out) else []


@pytest.mark.slow
def test_killed_build_is_invalid_then_resumes_to_the_same_dataset(corpus, sp_model, tmp_path):
    inputs = [os.path.join(corpus["dir"], f) for f in ("en.jsonl", "zh.jsonl")]
    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "data_prep", "build", *inputs, "--out", str(out), "--tokenizer", sp_model,
           "--shard-size", "48KB", "--no-progress"]
    # Ctrl-C in a terminal reaches the whole process group: workers and main; the main alone says it, in one line;
    # scancel's SIGTERM (to every process of the job) alike, with its own status
    busy = write_jsonl(tmp_path / "busy.jsonl", [{"text": f"{t} {k}"} for k in range(10) for t in corpus["en"]])
    for signum, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        ctrl_c = subprocess.Popen([*cmd[:4], busy, "--out", str(tmp_path / signum.name), *cmd[cmd.index("--out") + 2:],
                                   "--workers", "2"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        while len(_shards(tmp_path / signum.name)) < 2 and ctrl_c.poll() is None:
            time.sleep(0.02)
        os.killpg(ctrl_c.pid, signum)
        assert (ctrl_c.wait(60), ctrl_c.stderr.read()) == (status, "data_prep: interrupted; re-run the same command "
                                                                   "to resume\n")
    # a worker killed (the out-of-memory killer): one line, not a wait forever for the chunk it held (Pool starts
    # another worker and says nothing)
    args = [str(tmp_path / "oom") if a == str(tmp_path / "SIGTERM") else a for a in ctrl_c.args]
    killed = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not _shards(tmp_path / "oom") and killed.poll() is None:
        time.sleep(0.02)
    worker = psutil.Process(killed.pid).children()[0]
    worker.kill()
    try:
        said = killed.communicate(timeout=60)[1]
    finally:
        killed.kill()
    assert killed.returncode == 2 and said.splitlines()[-1] == (
        f"data_prep: error: build worker (pid {worker.pid}) was killed by SIGKILL, most often by the system's "
        "out-of-memory killer (`dmesg` says so); give the build more memory or fewer --workers, then re-run the same "
        "command to resume after its last finished shard"), said[-3000:]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(_shards(out)) < 4 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "build finished before it could be killed; use a larger input"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = _shards(out)
    check = run_cli("data_prep", "verify", out, check=False)
    assert check.returncode == 1 and "unfinished build" in check.stdout

    # a full disk (files over RLIMIT_FSIZE: EFBIG, as ENOSPC or a quota's EDQUOT) is one line; the shard it was writing
    # goes, the journal stays as it was
    was = json.load(open(out / ".partial" / "part00000.json"))
    full = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True, preexec_fn=lambda: resource.setrlimit(
        resource.RLIMIT_FSIZE, (16 << 10, 16 << 10)))
    said = full.communicate(timeout=120)[1]
    assert full.returncode == 2 and re.fullmatch(
        rf"(data_prep: .*\n)*data_prep: error: cannot write {out}/part00000-\d+\.arrow: File too large; free space "
        r"there \(or raise the quota\) and re-run the same command\n", said), said[-3000:]
    assert not list(out.glob(f"*.tmp{full.pid}")) and json.load(open(out / ".partial" / "part00000.json")) == was

    # damage the last finished shard: resume must notice by hash and rebuild from there
    journal = json.load(open(out / ".partial" / "part00000.json"))
    finished = [e["file"] for e in journal["shards"] if e["file"]]
    assert len(finished) >= 3 and set(finished) <= set(done)
    with open(out / finished[-1], "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    resumed = run_cli("data_prep", *cmd[3:])
    assert f"resuming after {len(finished) - 1} intact shards" in resumed.stderr
    assert "damaged" in resumed.stderr
    assert run_cli("data_prep", "verify", out).returncode == 0

    clean = tmp_path / "clean"
    quick_build(inputs, clean, tokenizer=sp_model, shard_size=48 << 10)
    assert contents(out) == contents(clean)
    assert [s["sha256"] for s in json.load(open(out / "manifest.json"))["shards"]] == \
           [s["sha256"] for s in json.load(open(clean / "manifest.json"))["shards"]]


def test_verify_catches_damage(small, sp_model, tmp_path):
    out = tmp_path / "ds"
    m = quick_build([small["path"]], out, tokenizer=sp_model, shard_size=64 << 10)
    assert run_cli("data_prep", "verify", out).stdout.strip().endswith("valid")
    first = out / m["shards"][0]["file"]
    data = bytearray(first.read_bytes())
    data[len(data) // 2] ^= 0x01
    first.write_bytes(bytes(data))
    shutil.copy(out / m["shards"][1]["file"], out / "part00000-09999.arrow")
    os.remove(out / m["shards"][2]["file"])
    proc = run_cli("data_prep", "verify", out, check=False)
    assert proc.returncode == 1
    assert f"INVALID: {m['shards'][0]['file']}: sha256 differs" in proc.stdout
    assert "INVALID: part00000-09999.arrow: shard not listed in the manifest" in proc.stdout
    assert f"INVALID: {m['shards'][2]['file']}: missing" in proc.stdout


def test_damaged_shard_is_one_line_when_opened(small, sp_model, tmp_path):
    from data_prep.dataset import Corpus

    m = quick_build([small["path"]], tmp_path / "ds", tokenizer=sp_model, shard_size=64 << 10)
    name, size, docs = (m["shards"][1][k] for k in ("file", "bytes", "num_documents"))

    def truncate(d):
        (d / name).write_bytes((d / name).read_bytes()[:-100])

    def overwrite(d):
        (d / name).write_bytes(b"x" * size)

    def recount(d):
        manifest = json.load(open(d / "manifest.json"))
        manifest["shards"][1]["num_documents"] += 1
        (d / "manifest.json").write_text(json.dumps(manifest))

    for damage, problem in ((truncate, f"truncated ({size - 100:,} of {size:,} bytes)"),
                            (overwrite, "not a readable Arrow IPC file"),
                            (recount, f"{docs:,} documents, the manifest says {docs + 1:,}")):
        d = tmp_path / damage.__name__
        shutil.copytree(tmp_path / "ds", d)
        damage(d)
        with pytest.raises(PrepError) as e:
            Corpus(str(d))
        msg = str(e.value)
        assert msg.startswith(f"{d / name}: {problem}") and f"python -m data_prep verify {d}" in msg, msg
        assert "\n" not in msg
        check = run_cli("data_prep", "verify", d, check=False)
        assert check.returncode == 1 and f"INVALID: {name}: " in check.stdout
        if damage is truncate:  # verify says what opening it says, not only that its hash differs
            assert f"INVALID: {name}: {problem}" in check.stdout, check.stdout
    assert f"{tmp_path / 'recount' / name}: " in _error("inspect", tmp_path / "recount")


def test_rebuild_is_a_no_op_and_other_options_need_overwrite(small, sp_model, tmp_path):
    out, src = tmp_path / "ds", tmp_path / "in.jsonl"
    shutil.copy(small["path"], src)
    args = ["data_prep", "build", src, "--out", out, "--tokenizer", sp_model, "--no-progress"]
    first = run_cli(*args)
    again = run_cli("data_prep", "build", os.path.relpath(src, ROOT), *args[3:])  # the same file, named otherwise
    assert "already built" in again.stderr and "time:" in first.stdout and "time:" not in again.stdout
    with open(src, "a") as f:
        f.write('{"text": "one more document"}\n')
    changed = run_cli(*args, check=False)
    assert changed.returncode == 2 and f"({src}: {os.path.getsize(src) - 30} -> {os.path.getsize(src)} bytes)" in \
        changed.stderr, changed.stderr
    shutil.copy(small["path"], src)
    os.makedirs(out / ".partial")  # what a build cut short after its manifest leaves: the re-run clears it
    assert run_cli("data_prep", "verify", out, check=False).returncode == 1
    run_cli(*args)
    assert run_cli("data_prep", "verify", out).returncode == 0
    other = run_cli(*args, "--min-chars", "400", check=False)
    assert other.returncode == 2 and "(min_chars 1 -> 400); pass --overwrite" in other.stderr, other.stderr
    run_cli(*args, "--min-chars", "400", "--overwrite")
    assert json.load(open(out / "manifest.json"))["stats"]["filtered_short"] > 0


def test_a_finished_partitioned_build_rerun_finalizes_as_a_no_op(three_files, sp_model, tmp_path, capsys):
    """A re-run chain (`ptm launch slurm` after a failed training): the partitions find the dataset built, and
    finalize, with no unfinished build left, says so and returns the manifest; the same tokenizer given at another
    path (the dataset's own copy) is the same build."""
    import data_prep.build as B

    out = tmp_path / "ds"
    for p in (0, 1):
        quick_build(three_files, out, tokenizer=sp_model, num_partitions=2, partition=p)
    m = B.finalize(str(out))
    for tokenizer in (sp_model, str(out / "tokenizer")):
        for p in (0, 1):
            assert quick_build(three_files, out, tokenizer=tokenizer, num_partitions=2, partition=p) == m
        assert B.finalize(str(out)) == m
    assert "already built and has no unfinished build; nothing to finalize" in capsys.readouterr().err
    assert json.load(open(out / "manifest.json")) == m


def test_finished_build_rerun_with_the_inputs_reordered_is_refused(three_files, sp_model, tmp_path):
    """The inputs' order is the documents' order (and decides which duplicate stays): not the same build."""
    quick_build(three_files[:2], tmp_path / "ds", tokenizer=sp_model)
    with pytest.raises(PrepError, match=re.escape("other options or inputs (the inputs' order); pass --overwrite")):
        quick_build(three_files[1::-1], tmp_path / "ds", tokenizer=sp_model)


def test_output_inside_an_input_directory_is_not_read(small, sp_model, tmp_path):
    """The inputs' directory holding --out: the dataset's own files (its journals and manifest are .json, a JSONL
    extension) are not inputs, so the build re-runs as a no-op."""
    (tmp_path / "in").mkdir()
    shutil.copy(small["path"], tmp_path / "in" / "a.jsonl")
    args = ["data_prep", "build", tmp_path / "in", "--out", tmp_path / "in" / "ds", "--tokenizer", sp_model,
            "--no-progress"]
    run_cli(*args)
    assert "already built" in run_cli(*args).stderr
    assert [s["path"] for s in json.load(open(tmp_path / "in" / "ds" / "manifest.json"))["sources"]] == \
        [str(tmp_path / "in" / "a.jsonl")]


def _error(*args):
    proc = run_cli("data_prep", *map(str, args), check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("data_prep: error: "), proc.stderr
    return lines[0]


def test_input_errors_are_one_clear_line(small, sp_model, tmp_path):
    small_path = small["path"]
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": "A sentence of text."}])
    out = tmp_path / "out"
    assert "input not found: nope/missing.jsonl" in _error("build", "nope/missing.jsonl", "--out", out)
    assert "matches no files" in _error("build", str(tmp_path / "*.parquet"), "--out", out)
    (tmp_path / "empty.jsonl").write_text("\n")
    assert "no documents left" in _error("build", tmp_path / "empty.jsonl", "--out", out, "--tokenizer", sp_model)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine line."}\n{"text": "broken\n{"body": "no text field"}\n')
    msg = _error("build", bad, "--out", out, "--tokenizer", sp_model)
    assert f"{bad}:2: malformed JSON" in msg and "--on-error skip" in msg
    msg = _error("build", bad, "--out", out, "--tokenizer", sp_model, "--text-field", "body")
    assert f"{bad}:1: no field 'body'" in msg
    (tmp_path / "file").write_text("x")
    assert "cannot write to output directory" in _error("build", good, "--out", tmp_path / "file" / "sub",
                                                        "--tokenizer", sp_model)
    import zstandard

    for name, compress in (("cut.jsonl.gz", gzip.compress), ("cut.jsonl.zst", zstandard.compress)):
        whole = compress(open(small_path, "rb").read())
        (tmp_path / name).write_bytes(whole[:len(whole) // 2])
        assert f"cannot read {tmp_path / name} as jsonl: " in _error("build", tmp_path / name, "--out", out,
                                                                     "--tokenizer", sp_model)
    assert "entity dictionary not found" in _error("build", good, "--out", tmp_path / "ent", "--entities",
                                                   tmp_path / "none.txt")
    assert not (tmp_path / "ent" / "tokenizer").exists()  # said before a tokenizer is trained
    said = run_cli("data_prep", "build", good, "--out", out, "--sentinels", "-3", check=False)
    assert said.returncode == 2 and "argument --sentinels: '-3' is not a count" in said.stderr.splitlines()[-1]
    (tmp_path / "weird.xyz").write_text("x")
    assert "--format" in _error("build", tmp_path / "weird.xyz", "--out", out)
    assert "train-tokenizer" in _error("build", good, "--out", tmp_path / "p", "--num-partitions", 2)
    assert "tokenizer not found" in _error("build", good, "--out", out, "--tokenizer", tmp_path / "none.model")
    text = write_jsonl(tmp_path / "text.jsonl", [{"text": "这是一个测试。你好世界，今天天气很好。" * 3}, {"text": "some English."}])
    for size, line in ((20, r"--vocab-size 20 is below the (\d+) pieces this corpus needs at least \(a piece per "
                            r"character, 256 byte-fallback pieces and the special tokens\); raise it"),
                       (5000, r"cannot train a 5000-piece unigram tokenizer on this corpus \(Vocabulary size too high "
                              r"\(5000\)\. Please set it to a value <= (\d+)\.\); change --vocab-size")):
        proc = run_cli("data_prep", "train-tokenizer", text, "--out", tmp_path / "t", "--vocab-size", size, check=False)
        said = proc.stderr.strip().splitlines()[-1]  # (after the line that says what it trains)
        assert proc.returncode == 2 and re.fullmatch("data_prep: error: " + line, said), proc.stderr
        assert 256 < int(re.fullmatch("data_prep: error: " + line, said)[1]) < 5000
    (tmp_path / "mine").mkdir()  # a build that could make no tokenizer leaves no directory of its own behind
    for where in ("none", "mine"):
        proc = run_cli("data_prep", "build", text, "--out", tmp_path / where, "--vocab-size", 20, check=False)
        assert proc.returncode == 2 and proc.stderr.strip().endswith("raise it")
    assert not (tmp_path / "none").exists() and os.listdir(tmp_path / "mine") == []


def test_bad_records_skipped_are_counted_and_listed(sp_model, tmp_path):
    src = tmp_path / "mixed.jsonl"
    with open(src, "wb") as f:
        f.write(b'{"text": "First good document."}\n')
        f.write(b'{"text": "bad \xff\xfe bytes"}\n')
        f.write(b'not json at all\n')
        f.write(b'{"text": "Second good document."}\n')
        f.write(b'{"text": 42}\n')
        f.write(b'{"text": null}\n')
    txt = tmp_path / "latin1.txt"
    txt.write_bytes("ok paragraph\n\ncaf\xe9 in latin-1\n\nanother ok paragraph\n".encode("latin-1"))
    assert f"{txt}:3: invalid UTF-8" in _error("build", txt, "--out", tmp_path / "o", "--tokenizer", sp_model)
    table, ints = tmp_path / "nulls.parquet", tmp_path / "ints.arrow"  # bad rows counted by reason, not by row
    pq.write_table(pa.table({"text": ["Third good document.", None, None]}), table)
    with pa.ipc.new_file(str(ints), pa.schema([("text", pa.int64())])) as w:
        w.write_table(pa.table({"text": [5, 6]}))
    m = quick_build([src, txt, table, ints], tmp_path / "ds", tokenizer=sp_model, on_error="skip")
    assert m["num_documents"] == 5
    assert m["stats"]["skipped"] == {"invalid UTF-8": 2, "malformed JSON": 1, "non-string field": 3, "null field": 3}
    rejects = (tmp_path / "ds" / "rejects.txt").read_text().splitlines()
    where = [f"{src}:2", f"{src}:3", f"{src}:5", f"{src}:6", f"{txt}:3", f"{table}: row 2", f"{table}: row 3",
             f"{ints}: row 1", f"{ints}: row 2"]
    assert [r[:len(w) + 2] for r, w in zip(rejects, where)] == [w + ": " for w in where] and len(rejects) == 9
    assert rejects[3] == f"{src}:6: field 'text' is null"
    nested = write_jsonl(tmp_path / "nested.jsonl", [{"content": {"body": None}}])
    assert _error("build", nested, "--out", tmp_path / "o", "--tokenizer", sp_model, "--text-field", "content.body") \
        == f"data_prep: error: {nested}:1: field 'content.body' is null; fix the input or pass --on-error skip to " \
           "skip such records"
    import data_prep.build as B  # a list held to its cap says how many it leaves out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(B, "MAX_REJECTS_PER_SHARD", 2)
        quick_build([src, txt], tmp_path / "capped", tokenizer=sp_model, on_error="skip")
    assert (tmp_path / "capped" / "rejects.txt").read_text().splitlines()[2:] == [
        "... and 3 more, not listed (at most 2 a shard)"]


def test_bad_record_fails_before_training_a_tokenizer(small, tmp_path):
    bad = tmp_path / "bad.jsonl"
    lines = open(small["path"], encoding="utf-8").readlines()
    bad.write_text("".join(lines[:1] + ['{"text": "broken\n'] + lines[1:]), encoding="utf-8")
    out = tmp_path / "ds"
    with pytest.raises(PrepError) as e:
        quick_build([bad], out, vocab_size=3000, num_unused=10)
    assert f"{bad}:2: malformed JSON" in str(e.value) and "--on-error skip" in str(e.value)
    assert not (out / "tokenizer").exists() and not list(out.rglob("*.model"))
    msg = _error("train-tokenizer", bad, "--out", tmp_path / "tok", "--vocab-size", 3000)
    assert f"{bad}:2: malformed JSON" in msg and not (tmp_path / "tok").exists()


@pytest.mark.distributed
def test_slurm_array_partitions_then_finalize(slurm, three_files, sp_model, reference, tmp_path):
    out = tmp_path / "ds"
    env = {**slurm.env, "PTM_PYTHON": sys.executable}
    proc = subprocess.run([os.path.join(ROOT, "slurm", "prep.sh"), "--wait", "3", str(out), *three_files,
                           "--tokenizer", sp_model], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                          timeout=300)
    logs = "".join(p.read_text() for p in out.glob("slurm-*.out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs
    assert len(list(out.glob("slurm-prep-*_*.out"))) == 3  # one Slurm array task per partition
    assert run_cli("data_prep", "verify", out).returncode == 0
    assert json.load(open(out / "manifest.json"))["num_partitions"] == 3
    assert contents(out) == reference["contents"]


def test_labelled_pairs(sp_model, tmp_path):
    """--pair-field and --label-field: a labelled pair dataset (ERNIE 2.0's discourse relation / IR relevance)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from data_prep.dataset import Corpus
    from data_prep.tokenizer import load_tokenizer

    rows = [{"q": "How do I open a file?", "t": "Use the built-in open function.", "y": 1},
            {"q": "What is a list?", "t": "Paris is the capital of France.", "y": 0},
            {"q": "Sort a list.", "t": "Call sorted on it. It returns a new list.", "y": 2},
            {"q": "A question of two paragraphs.\n\nHere is its second one.", "t": "An answer.\n\nAnd more.", "y": 1}]
    src = write_jsonl(tmp_path / "pairs.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pairs.parquet")  # read in the main process, not a worker
    tok, words = load_tokenizer(sp_model), lambda text: text.split()
    for src in (src, tmp_path / "pairs.parquet"):
        out = tmp_path / os.path.basename(src).replace(".", "-")
        m = quick_build([src], out, tokenizer=sp_model, text_field="q", pair_field="t", label_field="y")
        assert m["num_labels"] == 3
        c = Corpus(str(out))
        for i, r in enumerate(rows):  # segment B starts where the second field does, whatever paragraphs precede it
            ids, b = c.tokens(i), c.pair_start(i)
            assert c.label(i) == r["y"] and b > 0
            assert words(tok.decode(ids[:b])) == words(r["q"]) and words(tok.decode(ids[b:])) == words(r["t"]), src
    plain = quick_build([src], tmp_path / "plain", tokenizer=sp_model, text_field="q")
    assert plain["num_labels"] == 0 and Corpus(str(tmp_path / "plain")).label(0) == -1
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"q": "a question?", "t": "an answer.", "y": "yes"}])
    msg = _error("build", bad, "--out", tmp_path / "o", "--tokenizer", sp_model, "--text-field", "q",
                 "--pair-field", "t", "--label-field", "y")
    assert f"{bad}:1: label 'y' is 'yes', not a class id" in msg
    (tmp_path / "x.txt").write_text("text\n")
    assert "labelled data" in _error("build", tmp_path / "x.txt", "--out", tmp_path / "o2", "--label-field", "y")


def test_freed_chunk_memory_is_kept_for_the_next(small, sp_model, tmp_path, monkeypatch):
    """keep_freed_memory stops glibc from handing a freed 16 MB block back to the system, which it does by default
    (the next chunk would fault its pages in again), and a build calls it (main process and worker set-up)."""
    import data_prep.build as B

    calls = []
    monkeypatch.setattr(B, "keep_freed_memory", lambda real=B.keep_freed_memory: calls.append(real()) or calls[-1])
    quick_build([small["path"]], tmp_path / "ds", tokenizer=sp_model)
    assert calls and all(calls), calls
    script = ("import sys, numpy as np\nfrom data_prep.build import keep_freed_memory\n"
              "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096\n"
              "kept = keep_freed_memory() if sys.argv[1] == 'keep' else None\n"
              "a = np.ones(16 << 20, np.uint8)\nbefore = rss()\ndel a\nprint(kept, (before - rss()) >> 20)")
    runs = {how: subprocess.run([sys.executable, "-c", script, how], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split() for how in ("keep", "default")}
    assert runs["keep"][0] == "True" and int(runs["keep"][1]) <= 1, runs  # MB given back
    assert int(runs["default"][1]) >= 15, runs


def test_inspect_shows_every_word_of_its_samples(train_data):
    """`data_prep inspect`'s "first words" of every document: a word that is a lone space piece (sentencepiece's ▁
    before a piece it did not merge with) shows as ␣, not as nothing between two slashes."""
    from data_prep.inspect import inspect

    report = inspect(train_data, samples=1000).splitlines()
    shown = [line.removeprefix("  first words: ").split(" / ") for line in report if line.startswith("  first words: ")]
    assert len(shown) > 600 and all(all(words) for words in shown), shown
    assert any("␣" in words for words in shown)


def test_inspect_shows_a_document_of_a_dataset_without_sentences(small, sp_model, tmp_path):
    """--structure none records no sentence starts: the sample is the whole document, not an empty line."""
    from data_prep.inspect import inspect
    from data_prep.text import TextOptions

    quick_build([small["path"]], tmp_path / "ds", tokenizer=sp_model, text=TextOptions(structure="none"))
    report = inspect(str(tmp_path / "ds"), samples=3).splitlines()
    heads = [k for k, line in enumerate(report) if re.match(r"document \d+ \(", line)]
    assert len(heads) == 3 and all(report[k + 1].strip() for k in heads), report
