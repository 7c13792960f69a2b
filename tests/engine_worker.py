"""Run under torchrun (or alone): train several tiny configs one after another in the same process group, each
into OUT/NAME, so that tests compare layouts without paying process start-up for each.

    torchrun --nproc_per_node 4 tests/engine_worker.py OUT '{"NAME": ["CONFIG", "key=value", ...], ...}'
"""
import json
import sys

from pretrain.config import load
from pretrain.train import Trainer

if __name__ == "__main__":
    out, runs = sys.argv[1], json.loads(sys.argv[2])
    for name, overrides in runs.items():
        trainer = Trainer(load(overrides[0], [*overrides[1:], f"out_dir={out}/{name}"]))
        if name.endswith("-naive"):  # LAMB as if unaware of ZeRO: trust ratios of whole partitions (DeepSpeed #490)
            trainer.optimizer.layout = None
        trainer.fit()
