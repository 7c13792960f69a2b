"""From a config to a run ready to build, on every rank: the launch checked, the process groups up, the checkpoint to
resume chosen (rank 0 decides), the datasets opened (their tokenizer checked once), the vocabulary and padding id taken
from them, the model sizes an init_from checkpoint gives, and the config validated once.

    run = resolve(cfg)     # run.cfg is final; run.resume, run.objective, run.corpora, ...
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from pretrain import checkpoint as C
from pretrain.checkpoint_manager import Checkpoints, adopt_model_shape, run_identity
from pretrain import device as dev
from pretrain import heartbeat, memory, objectives
from pretrain.config import AUTO, Config, ConfigError
from pretrain.data.factory import open_corpora
from pretrain.parallel import mcore
from pretrain.runlog import log


@dataclass
class Resolved:
    cfg: Config  # final: validated, with the dataset's vocabulary and padding id
    world: int
    corpora: list  # the datasets of data.path
    identity: dict  # what the run trains on, as checkpoints record it (`checkpoint_manager.run_identity`)
    objective: objectives.Objective  # configured
    checkpoints: Checkpoints
    resume: str | None  # the checkpoint to resume, or None
    meta: dict | None  # its meta.json
    init: str | None  # checkpoint.init_from's checkpoint, when not resuming
    most_frequent: int  # the most frequent token id of the data: the unigram baseline


def resolve(cfg: Config) -> Resolved:
    world = mcore.launched_world_size()
    if world % cfg.parallel.tp:  # before any process group is built
        raise ConfigError(f"parallel.tp={cfg.parallel.tp} does not divide the {world} processes launched; launch "
                          f"a multiple of {cfg.parallel.tp} processes or set parallel.tp to a divisor of {world}")
    collective_timeout_s = heartbeat.collective_timeout_s(cfg.parallel)
    mcore.init_processes(cfg.parallel.timeout_s, collective_timeout_s)
    heartbeat.start(cfg.parallel)  # from here a rank gone silent ends every rank with one line
    checkpoints = Checkpoints(cfg.out_dir, cfg.checkpoint.keep, log=log)
    resume = checkpoints.newest_complete()
    meta = C.read_meta(resume) if resume else None
    seed = (meta or {}).get("run", {}).get("seed", cfg.seed)
    if seed != cfg.seed:
        log(f"seed {seed} from {resume} (the config says {cfg.seed}): a resumed run keeps its seed")
        cfg.seed = seed
    init = None
    if cfg.checkpoint.init_from and not resume:
        init = C.resolve(cfg.checkpoint.init_from)
        taken = adopt_model_shape(cfg, init)
        if taken:
            log(f"model sizes from {init}: " + ", ".join(f"{k}={getattr(cfg.model, k)}" for k in taken))
    readable = all(os.path.isfile(os.path.join(p, "manifest.json")) for p in cfg.data.paths if p)
    corpora = _datasets(cfg) if readable and all(cfg.data.paths) else None
    if corpora is not None and cfg.train.micro_batch_size == AUTO:
        _pick_micro_batch(cfg, world)
    cfg.validate(dp=world // cfg.parallel.tp)  # once, with the dataset's vocabulary and padding id
    if corpora is None:  # a valid config whose data.path is no dataset: the dataset's own error
        _datasets(cfg)
    dev.check_precision(cfg.precision)
    dev.deterministic(cfg.train.deterministic)
    mcore.initialize(cfg.parallel.tp, cfg.seed, cfg.parallel.timeout_s, collective_timeout_s)
    sample = corpora[0].shards[0].values["input_ids"][:10_000_000]
    return Resolved(cfg=cfg, world=world, corpora=corpora, identity=run_identity(cfg, corpora),
                    objective=objectives.get(cfg.data.objective).configured(cfg), checkpoints=checkpoints,
                    resume=resume, meta=meta, init=init,
                    most_frequent=int(np.bincount(sample, minlength=cfg.model.vocab_size).argmax()))


def _pick_micro_batch(cfg: Config, world: int) -> None:
    """train.micro_batch_size=auto: the largest micro batch the memory estimate fits on the smallest rank's device,
    the same on every rank."""
    capacity = dev.capacity_gib()
    cfg.train.micro_batch_size = micro = memory.auto_micro_batch(cfg, world, capacity)
    per_rank = cfg.train.global_batch_size // (world // cfg.parallel.tp)
    log(f"train.micro_batch_size=auto: {micro} ({per_rank // micro} accumulation step{'s' * (per_rank > micro)} of "
        f"{per_rank} sequences per rank; {memory.HEADROOM:.0%} of {capacity:.1f} GiB per "
        f"{'GPU' if dev.device().type == 'cuda' else 'process, of the host memory'}"
        + ("; smaller in train.batch_rampup's steps whose batches it does not divide" if cfg.train.batch_rampup
           else "") + ")")


def _datasets(cfg: Config) -> list:
    """The datasets of data.path; the model takes their vocabulary size, and RoBERTa's positions their padding id."""
    try:
        corpora = open_corpora(cfg.data.paths)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    vocab = corpora[0].vocab_size
    if cfg.model.vocab_size == 0:
        cfg.model.vocab_size = vocab
    elif cfg.model.vocab_size != vocab:
        raise ConfigError(f"model.vocab_size {cfg.model.vocab_size} does not match the dataset's tokenizer "
                          f"({vocab} ids in {cfg.data.paths[0]}); set model.vocab_size=0 to take the dataset's")
    pad = corpora[0].special_ids.get("pad")
    if cfg.model.positional.from_pad and cfg.model.pad_token_id != pad:
        if pad is None:
            raise ConfigError(f"model.position_encoding={cfg.model.position_encoding} numbers positions from the "
                              f"padding id, and the tokenizer of {cfg.data.paths[0]} has none; build the dataset with "
                              f"one that has [PAD] or <pad>")
        if cfg.model.pad_token_id != -1:
            raise ConfigError(f"model.pad_token_id {cfg.model.pad_token_id} is not the dataset's padding id ({pad} in "
                              f"{cfg.data.paths[0]}); set model.pad_token_id=-1 to take the dataset's")
        cfg.model.pad_token_id = pad
    return corpora
