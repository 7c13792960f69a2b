"""The GPU benchmark runs unchanged: on this CPU with 2-layer models, every ptm and Hugging Face row of every case
measures; megatron-core's own models allocate on the current CUDA device, so on a CPU their rows say exactly that
(with that one call pointed at the CPU they run: checked by hand when the rows were written). The GPU smoke run
(bench/gpu_smoke.py) trains every path in its tiny mode."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, read_jsonl
from runs import summary


def test_gpu_step_benchmark_runs_every_row_on_tiny_models():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_step.py"), "--tiny", "--steps", "1",
                           "--cases", "bert-large-128", "gpt2-medium-1024", "--precisions", "bf16"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if re.match(r"(ptm|HF|megatron)", line)]
    assert len(rows) == 14, proc.stdout
    failed = [line for line in rows if "could not run" in line and not
              (line.startswith("megatron-core") and "Torch not compiled with CUDA enabled" in line) and not
              (line.startswith("ptm graphed") and "CUDA graphs need a CUDA device" in line)]
    assert not failed, "\n".join(failed) + proc.stderr[-3000:]
    for line in rows:
        if "could not run" in line:
            continue
        samples_per_s = float(line[18:28])
        assert samples_per_s > 0, line


def test_gpu_profile_reports_each_variant_on_tiny_models():
    """bench/gpu_profile.py --tiny: per variant, the step's wall and busy time, launches, syncs and what dynamo
    compiled, then the kernels (none on a CPU) and the host ops that took the most time."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_profile.py"), "--tiny", "--steps", "1",
                           "--variants", "eager lamb", "eager adamw"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    heads = re.findall(r"^  (eager \w+): step ([\d.]+) ms .* launches, syncs .* dynamo during the profile", proc.stdout,
                       re.M)
    assert [h[0] for h in heads] == ["eager lamb", "eager adamw"] and all(float(h[1]) > 0 for h in heads), proc.stdout
    hosts = re.findall(r"host ops by self CPU time per step:\n((?:\s+[\d.]+ ms +\d+x .*\n)+)", proc.stdout)
    assert len(hosts) == 2 and all(h.count("\n") >= 5 for h in hosts), proc.stdout  # each variant's top host ops


SMOKE_PATHS = [f"{p}-zero{z}" for p in ("fp32", "bf16", "fp16") for z in range(4)] + [
    "offload-zero2", "offload-zero3", "fused-loss-on", "fused-loss-off", "compile", "unpadded"]


@pytest.mark.distributed
def test_gpu_smoke_runs_every_path_and_goes_on_past_failures(tmp_path):
    """bench/gpu_smoke.py --tiny: every path trains on 1 and 2 processes (the fused loss under Triton's interpreter);
    on 2 processes one path fails by its config (a global batch 2 processes cannot split: the worker's own error
    line) and one launch aborts as NCCL's watchdog would (the test hook: the line scraped from the ranks' stderr);
    the paths after each still run in a new launch, and the exit status says that not all were ok."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_smoke.py"), "--tiny", "--out", str(tmp_path),
                           "--set", "fp16-zero2:train.global_batch_size=6"], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "GPU_SMOKE_ABORT": "bf16-zero1@2"})
    table = proc.stdout.split("\n\n")[-1].splitlines()
    assert "34 of 36 paths ok" in table[0], proc.stdout + proc.stderr[-3000:]
    rows = {(line.split()[0], int(line.split()[1])): line for line in table[2:]}
    assert sorted(rows) == sorted((p, n) for p in SMOKE_PATHS for n in (1, 2)), proc.stdout
    failed = {"fp16-zero2": "ConfigError: train.global_batch_size=6 is not divisible by train.micro_batch_size x "
                            "data-parallel size = 2 x 2 = 4",
              "bf16-zero1": "what():  GPU_SMOKE_ABORT=bf16-zero1@2: a simulated abort"}
    for (path, nproc), line in rows.items():
        if nproc == 2 and path in failed:
            assert failed[path] in line, line
            continue
        step_ms, _, peak_gib = line[22:32], line[32:39], line[39:49]
        assert line.endswith(" ok") and float(step_ms) > 0 and float(peak_gib) > 0, line
    assert "eager + fused loss" in rows["fused-loss-on", 1] and " compile " in rows["compile", 1]
    assert proc.returncode == 1


@pytest.mark.distributed
def test_gpu_smoke_trains_each_config_with_its_own_overrides(tmp_path, train_data):
    """--configs trains the paths once per config, runs named CONFIG.PATH; a --set prefix names one config's runs; a
    second call with the same --out reports and keeps only its own runs; a prefix that names nothing stops before
    anything runs, listing the names there are."""
    smoke = [sys.executable, os.path.join(ROOT, "bench", "gpu_smoke.py"), "--tiny", "--out", str(tmp_path),
             "--data", train_data, "--nproc", "1", "--paths", "fp32-zero1", "--configs", "bert-tiny", "gpt2-tiny"]
    proc = subprocess.run([*smoke, "--set", "gpt2-tiny:train.steps=3"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert "2 of 2 paths ok" in proc.stdout and proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    steps = {name: len(read_jsonl(os.path.join(tmp_path, "runs", "n1", name, "metrics.jsonl")))
             for name in ("bert-tiny.fp32-zero1", "gpt2-tiny.fp32-zero1")}
    assert steps == {"bert-tiny.fp32-zero1": 2, "gpt2-tiny.fp32-zero1": 3}
    launch = read_jsonl(os.path.join(tmp_path, "logs", "n1-launch1.jsonl"))
    again = subprocess.run(smoke, cwd=ROOT, capture_output=True, text=True, timeout=600)  # (the same --out)
    assert "2 of 2 paths ok" in again.stdout and again.returncode == 0, again.stdout + again.stderr[-3000:]
    steps = {name: len(read_jsonl(os.path.join(tmp_path, "runs", "n1", name, "metrics.jsonl"))) for name in steps}
    assert steps == {"bert-tiny.fp32-zero1": 2, "gpt2-tiny.fp32-zero1": 2}  # (this call's runs only, not appended)
    assert len(read_jsonl(os.path.join(tmp_path, "logs", "n1-launch1.jsonl"))) == len(launch)  # (this call's rows)
    bad = subprocess.run([*smoke, "--set", "t5-tiny:train.steps=3"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "there is no path, config or run 't5-tiny'" in bad.stderr, bad.stderr[-2000:]
    assert "gpt2-tiny.fp32-zero1" in bad.stderr and not os.path.isdir(os.path.join(tmp_path, "logs", "n1-launch2"))


def test_train_profile_profiles_a_real_training_step(tmp_path, train_data):
    """bench/train_profile.py: a real `ptm train` run (XLNet with its memory and streams), its profiled steps'
    wall time, launches, syncs and host ops (no kernels on a CPU); called again with the same --out, one line says
    the run there would resume."""
    profile = [sys.executable, os.path.join(ROOT, "bench", "train_profile.py"), "xlnet-tiny", "--set",
               f"data.path={train_data}", "data.valid_fraction=0.2", "train.global_batch_size=4",
               "train.micro_batch_size=2", "--warmup", "1", "--steps", "2", "--out", str(tmp_path)]
    proc = subprocess.run(profile, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    head = re.search(r"^  xlnet-tiny: step ([\d.]+) ms \(median of 2\), GPU busy 0.0 ms", proc.stdout, re.M)
    assert head and float(head[1]) > 0, proc.stdout
    hosts = re.search(r"host ops by self CPU time per step:\n((?:\s+[\d.]+ ms +\d+x .*\n?)+)", proc.stdout)
    assert hosts and "aten::" in hosts[1], proc.stdout
    assert len(read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))) == 3  # the warm-up step and the two profiled
    again = subprocess.run(profile, cwd=ROOT, capture_output=True, text=True, timeout=600)  # (the same --out)
    assert again.returncode == 1 and again.stderr.splitlines()[-1] == (
        f"train_profile.py: --out {tmp_path} holds a run (it would resume from step_00000003): remove it or give "
        "another --out"), again.stderr[-3000:]  # (it resumed and profiled nothing: a "no median" traceback)


def test_preset_fingerprints_repeat_bit_for_bit_and_catch_a_change(tmp_path, train_data):
    """bench/preset_fingerprint.py (issue 40's before/after check): the same presets give the same weights and losses
    twice; a change that moves training (another seed) is reported and exits 1."""
    script = [sys.executable, os.path.join(ROOT, "bench", "preset_fingerprint.py"), train_data, "--presets",
              "bert-tiny", "gpt2-tiny"]
    first = subprocess.run([*script, "--out", str(tmp_path / "before.json")], capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 0 and "not run" not in first.stdout, first.stdout + first.stderr[-3000:]
    same = subprocess.run([*script, "--against", str(tmp_path / "before.json")], capture_output=True, text=True,
                          timeout=600)
    assert same.returncode == 0 and "2 of 2 presets as before" in same.stdout, same.stdout + same.stderr[-3000:]
    moved = subprocess.run([*script, "--set", "seed=7", "--against", str(tmp_path / "before.json")],
                           capture_output=True, text=True, timeout=600)
    assert moved.returncode == 1 and "0 of 2 presets as before; differ: bert-tiny, gpt2-tiny" in moved.stdout, \
        moved.stdout + moved.stderr[-3000:]


def test_parallel_overhead_trains_each_layout_afresh(tmp_path, train_data, monkeypatch):
    """bench/parallel_overhead.py called again with the same --work: each layout's run is trained afresh (`ptm train`
    resumed the earlier call's at its end, trained nothing, and the table repeated the earlier call's times)."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    import parallel_overhead

    args = parallel_overhead.argparse.Namespace(nproc=1, config="bert-tiny", steps=4, overrides=[
        "optimizer.warmup_steps=1", "data.valid_fraction=0.2", "train.global_batch_size=4", "train.micro_batch_size=2"])
    for _ in range(2):
        assert parallel_overhead.step_seconds(args, "tp1", [], str(tmp_path), train_data) > 0
    assert not summary(tmp_path / "tp1").get("resumed_from")
    assert len(read_jsonl(tmp_path / "tp1" / "metrics.jsonl")) == 4


@pytest.mark.parametrize("script", ["gpu_step.py", "gpu_profile.py"])
def test_gpu_benchmarks_without_a_gpu_say_so_unless_tiny(script):
    """Without CUDA the full-size models would train on the CPU for hours: one line says what to do instead."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), "--steps", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 1 and "torch" not in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.splitlines()[-1] == (f"{script}: no CUDA device here: run it on a GPU machine, or add --tiny "
                                            "to check it on this CPU"), proc.stderr[-2000:]


@pytest.mark.parametrize("module,pipeline", [("psutil", "ptm"), ("datasets", "ref")])
def test_prep_throughput_names_a_missing_bench_extra_before_any_work(module, pipeline):
    """bench/prep_throughput.py without the `bench` extra's psutil (any pipeline) or datasets (the ref pipeline):
    one line before the corpus and the sentencepiece model are made, not a traceback from a run."""
    script = os.path.join(ROOT, "bench", "prep_throughput.py")
    run = (f"import runpy, sys; sys.modules[{module!r}] = None; "  # as if not installed: importing it fails
           f"sys.argv = [{script!r}, '--mb', '0.1', '--mb2', '0', '--workers', '1', '--pipelines', {pipeline!r}]; "
           f"runpy.run_path({script!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", run], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.splitlines() == [
        f"prep_throughput.py: {module} is not installed (pip install 'ptm[bench]')"
        + ("; or leave ref out of --pipelines" if module == "datasets" else "")], proc.stderr[-3000:]


@pytest.mark.parametrize("args", [["train_profile.py", "bert-tiny", "--set", "data.path=/nonexistent"],
                                  ["host_model.py", "/nonexistent"],
                                  ["loader_throughput.py", "--data", "/nonexistent"],
                                  ["preset_fingerprint.py", "/nonexistent", "--against", "/nonexistent.json"]])
def test_bench_scripts_name_a_bad_dataset_or_file_in_one_line(args, tmp_path):
    """A path that is not a dataset (or not an earlier --out's file): the script's name and what is wrong on one
    line, no traceback."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", args[0]), *args[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    last = proc.stderr.splitlines()[-1] if proc.stderr else ""
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert last.startswith(f"{args[0]}: ") and "/nonexistent" in last, proc.stderr[-3000:]


@pytest.mark.parametrize("args,line", [
    (["cpu_step.py", "--hidden", "32"], "cpu_step.py: --hidden 32: give 64 or more (heads of 64)"),
    (["cpu_step.py", "--steps", "0"], "cpu_step.py: --steps 0: give 1 or more"),
    (["optimizer_step.py", "--device", "cuda"],
     "optimizer_step.py: --device cuda: no CUDA device here: leave --device out, or give cpu")])
def test_cpu_benchmarks_refuse_what_they_cannot_run_in_one_line(args, line):
    """Sizes the step cannot take (no heads, no timed step) and a device that is not here: one line, no traceback."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", args[0]), *args[1:]], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 1 and proc.stderr.splitlines()[-1:] == [line], proc.stderr[-3000:]


def test_index_build_help_describes_it_without_running_it():
    """bench/index_build.py has no options, but --help says what it times (it ran the whole benchmark)."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "index_build.py"), "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: index_build.py"), proc.stdout + proc.stderr
    assert "sentence table" not in proc.stdout, proc.stdout
