"""The run's logs under a disk that refuses writes for a while (files over RLIMIT_FSIZE: EFBIG, as a full disk's
ENOSPC): a warning each, no traceback, the rows going on when there is space again."""
import json
import subprocess
import sys
import textwrap

from conftest import ROOT

# (its own process: the file-size limit holds for every file of the process that sets it, pytest's own included)
SCRIPT = textwrap.dedent("""
    import os, resource, sys
    from pretrain.runlog import RunLog

    out = sys.argv[1]
    log = RunLog(out, True, lambda line: print(f"pretrain: {line}", file=sys.stderr, flush=True))
    log.start("seed: 1\\n", {}, total=1000, done=0)
    metrics = {f"metric_{k}": 1.5 + k for k in range(40)}  # (a row of some 1.2 KB, TensorBoard's events more)
    for step in (1, 2):
        log.step(step, metrics, False, ())
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(f"{out}/metrics.jsonl") + 100, hard))
    step = 2
    while log.writer is not None and step < 500:  # (TensorBoard's thread writes as its buffer fills)
        step += 1
        log.step(step, metrics, False, ())
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    for more in (1, 2):
        log.step(step + more, metrics, False, ())
    log.close()
    print(step)
""")


def test_a_disk_refusing_writes_for_a_while_costs_the_logs_the_rows_it_refused(tmp_path):
    """metrics.jsonl: the row refused part way is cut off again (the next does not join it), rows go on once writes
    are taken; TensorBoard's failure (its writer thread's, raised again by each later call: it stopped every later
    row, and its close replaced the error a run ended with) ends its curves alone, said in one warning, without
    its thread's traceback; close() raises nothing."""
    from pretrain.report import log_rows

    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = int(proc.stdout.split()[-1])
    assert 2 < last < 500
    assert [row["step"] for row in log_rows(str(tmp_path / "metrics.jsonl"))] == [1, 2, last + 1, last + 2]
    assert all(json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())
    err = proc.stderr
    assert "Traceback" not in err and "Exception in thread" not in err, err[-3000:]
    assert err.count(f"pretrain: warning: cannot write {tmp_path}/metrics.jsonl: File too large; the run goes on, "
                     "its logs missing steps until there is space") == 1, err[-3000:]
    assert err.count(f"pretrain: warning: cannot write {tmp_path}/tensorboard: File too large; the run goes on, "
                     f"TensorBoard's curves ending at step {last} (metrics.jsonl goes on)") == 1, err[-3000:]


def test_a_copy_the_disk_refuses_names_the_file_it_was_writing(tmp_path):
    """copy_tree (a checkpoint's tokenizer, reshard's and sentinels' copies) stops at the first file the disk refuses
    (here one whose destination is /dev/full: ENOSPC) with that OSError naming the destination: shutil's fast copy
    named the source (the user's input said to be out of space), and copytree raised every file's error as one
    list that no message reads."""
    import errno
    import os

    from ptm.files import copy_file, copy_tree, refused_write

    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "sub" / "spm.model").write_bytes(b"x" * 5000)
    (tmp_path / "dst" / "sub").mkdir(parents=True)
    os.symlink("/dev/full", tmp_path / "dst" / "sub" / "spm.model")
    for copy, target in ((copy_tree, tmp_path / "dst"), (copy_file, tmp_path / "dst" / "sub" / "spm.model")):
        source = tmp_path / "src" if copy is copy_tree else tmp_path / "src" / "sub" / "spm.model"
        try:
            copy(str(source), str(target))
            raise AssertionError("the copy into /dev/full went through")
        except OSError as e:
            assert e.errno == errno.ENOSPC and refused_write(e, "?") == (
                f"cannot write {tmp_path}/dst/sub/spm.model: No space left on device")


def test_an_existing_out_dir_this_user_may_not_write_is_refused_before_training():
    """An out_dir that exists and that this user may not write (here root's, checked by an unprivileged user; a
    read-only file system says so): one line naming it and the fix, before any work (it ended in a traceback on
    config.yaml, the run's first file)."""
    script = textwrap.dedent("""
        import os, sys
        from pretrain.config import ConfigError, load

        cfg = load("bert-tiny", [f"out_dir={sys.argv[1]}", f"data.path={sys.argv[1]}"])
        cfg.validate()  # (as root: nothing to say)
        os.setgid(65534)
        os.setuid(65534)
        try:
            cfg.validate()
        except ConfigError as e:
            print(e)
    """)
    import os
    if os.geteuid() != 0:
        import pytest
        pytest.skip("needs root, to check as another user a directory root owns")
    import shutil
    import tempfile

    out = tempfile.mkdtemp(dir="/tmp")  # (tmp_path lies in a directory only root may enter)
    try:
        proc = subprocess.run([sys.executable, "-c", script, out], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    finally:
        shutil.rmtree(out)
    assert proc.returncode == 0 and proc.stdout.splitlines() == [
        f"out_dir={out} is not writable by this user; make it writable, or set out_dir elsewhere"], proc.stderr
