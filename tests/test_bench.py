"""The GPU benchmark runs unchanged: on this CPU with 2-layer models, every ptm and Hugging Face row of every case
measures; megatron-core's own models allocate on the current CUDA device, so on a CPU their rows say exactly that
(with that one call pointed at the CPU they run: checked by hand when the rows were written)."""
import os
import re
import subprocess
import sys

from conftest import ROOT


def test_gpu_step_benchmark_runs_every_row_on_tiny_models():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_step.py"), "--tiny", "--steps", "1",
                           "--cases", "bert-large-128", "gpt2-medium-1024", "--precisions", "bf16"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if re.match(r"(ptm|HF|megatron)", line)]
    assert len(rows) == 10, proc.stdout
    failed = [line for line in rows if "could not run" in line and not
              (line.startswith("megatron-core") and "Torch not compiled with CUDA enabled" in line)]
    assert not failed, "\n".join(failed) + proc.stderr[-3000:]
    for line in rows:
        if "could not run" in line:
            continue
        samples_per_s = float(line[18:28])
        assert samples_per_s > 0, line
