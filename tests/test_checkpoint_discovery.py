"""Finding the checkpoint to resume on a shared filesystem: ranks that see different directory listings (a node
whose NFS cache lags after a requeue) still decide together, from rank 0's listing, and never run different
collectives (a hang)."""
import builtins
import io
import json
import os
import socket
import time
from datetime import timedelta

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from pretrain import checkpoint as C
from pretrain.checkpoint_manager import Checkpoints
from pretrain.models.config import ModelConfig

HIDDEN = "step_00000002"


def _write(root, step: int) -> None:
    ckpt = os.path.join(root, "checkpoints", f"step_{step:08d}")
    os.makedirs(os.path.join(ckpt, "shards"))
    with open(os.path.join(ckpt, "shards", "param.bin"), "wb") as f:
        f.write(os.urandom(64))
    C.write_meta(ckpt, model=ModelConfig(), params={}, step=step)
    C.mark_latest(root, f"step_{step:08d}")


def _rank(rank: int, store: str, out: str, hide_s: float, tries: int) -> None:
    """One rank finding the newest complete checkpoint; for its first `hide_s` s rank 1 does not see step 2, and its
    `latest` still names step 1 (what a lagging NFS cache shows after a requeue)."""
    if rank == 1:
        until, real = time.monotonic() + hide_s, (os.listdir, os.path.isdir, os.path.isfile, builtins.open)

        def stale(path) -> bool:
            return HIDDEN in str(path) and time.monotonic() < until

        def old_latest(path, *args, **kwargs):
            if str(path).endswith(os.path.join("checkpoints", C.LATEST)) and time.monotonic() < until:
                return io.StringIO("step_00000001\n")
            return real[3](path, *args, **kwargs)

        os.listdir = lambda p=".": [n for n in real[0](p) if not (n == HIDDEN and time.monotonic() < until)]
        os.path.isdir = lambda p: not stale(p) and real[1](p)
        os.path.isfile = lambda p: not stale(p) and real[2](p)
        builtins.open = old_latest
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    checkpoints = Checkpoints(out, keep=0, log=lambda msg: None)
    checkpoints.visibility_tries, checkpoints.visibility_wait_s = tries, 0.25
    try:
        answer = os.path.basename(checkpoints.newest_complete())
    except C.CheckpointError as e:
        answer = f"error: {e}"
    with open(os.path.join(out, f"answer{rank}.json"), "w") as f:
        json.dump(answer, f)
    dist.destroy_process_group()


def _answers(tmp_path, hide_s: float, tries: int) -> list[str]:
    for step in (1, 2):
        _write(str(tmp_path), step)
    mp.start_processes(_rank, args=(str(tmp_path / "store"), str(tmp_path), hide_s, tries), nprocs=2,
                       start_method="spawn")
    return [json.load(open(tmp_path / f"answer{r}.json")) for r in range(2)]


@pytest.mark.parametrize("hide_s", [1.5])
def test_a_rank_whose_listing_lags_resumes_what_rank_0_sees(tmp_path, hide_s):
    assert _answers(tmp_path, hide_s, tries=40) == [HIDDEN, HIDDEN]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["latest", "step_00000001", HIDDEN]  # nothing set aside


def test_a_rank_that_never_sees_the_checkpoint_is_one_error_naming_it(tmp_path):
    answers = _answers(tmp_path, hide_s=3600, tries=3)
    assert answers[0] == answers[1], answers
    assert answers[0].startswith(f"error: rank 1 on {socket.gethostname()} does not see ")
    assert HIDDEN in answers[0] and "stale" in answers[0] and "\n" not in answers[0]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["latest", "step_00000001", HIDDEN]
