"""ELMo checkpoints <-> bilm-tf's files, which AllenNLP's `Elmo` (and the tools built on it) read: `options.json`,
`weights.hdf5` and the vocabulary (`vocab.txt`, with `counts.tsv` beside it).

weights.hdf5 holds what bilm-tf's `dump_weights` writes, under its names and TF's layouts: `char_embed` (261 rows:
character ids 1..261, row 0 being padding), `CNN/W_cnn_{i}` [1, width, E, filters] and `CNN/b_cnn_{i}`,
`CNN_high_{k}/{W,b}_{transform,carry}` (y = t * relu(x W_transform + b_transform) + (1 - t) * x, t = sigmoid(x W_carry +
b_carry)), `CNN_proj/{W,b}_proj`, and per direction d (0 forward, 1 backward) and layer l
`RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/` `W_0` [inputs + P, 4C] (gates i, j, f, o: TF's LSTMCell order), `B` [4C]
(without the 1.0 TF adds to the forget gate when it runs, as ptm's model holds it too) and `W_P_0` [C, P]. It also holds the shared softmax,
`softmax/W` [vocabulary, P] and `softmax/b`, which bilm-tf keeps only in its TF checkpoint and AllenNLP does not read:
an import continues pretraining with it (without it, the softmax starts afresh and is reported).
"""
from __future__ import annotations

import io
import json
import os

import numpy as np
import torch

from pretrain import checkpoint as C
from pretrain.models.config import ModelConfig
from ptm.files import copy_file, whole_dir, write_bytes, write_json

LSTM = "RNN_{d}/RNN/MultiRNNCell/Cell{l}/LSTMCell/"
DIRECTIONS = ("forward_lstms", "backward_lstms")
TOKENIZER_FILES = ("vocab.txt", "counts.tsv", "ptm_tokenizer.json")


def _gates(w: torch.Tensor, cell: int) -> torch.Tensor:
    """Gate blocks (input, forget, candidate, output) <-> TF's (input, candidate, forget, output): the same swap."""
    i, a, b, o = w.split(cell)
    return torch.cat([i, b, a, o])


SAME = (lambda t: t, lambda t: t)  # (ptm -> file, file -> ptm)
TRANSPOSED = (lambda t: t.T, lambda t: t.T)
CONV = (lambda t: t.permute(2, 1, 0)[None], lambda t: t[0].permute(2, 1, 0))  # [filters, E, width] <-> [1, width, E, filters]
PADDED = (lambda t: t[1:], lambda t: torch.cat([t.new_zeros(1, t.shape[1]), t]))  # the padding id's row: not in the file


def key_map(cfg: ModelConfig) -> dict[str, tuple[str, tuple]]:
    """ptm parameter -> (weights.hdf5 name, (to the file, from it)), for every parameter but the LSTMs' input and
    recurrent weights, which share one TF kernel (`W_0`)."""
    gates = (lambda t: _gates(t, cfg.ffn_hidden_size),) * 2
    m = {"chars.embedding.weight": ("char_embed", PADDED), "chars.projection.weight": ("CNN_proj/W_proj", TRANSPOSED),
         "chars.projection.bias": ("CNN_proj/b_proj", SAME), "softmax.weight": ("softmax/W", SAME),
         "softmax.bias": ("softmax/b", SAME)}
    for i in range(len(cfg.char_filters)):
        m[f"chars.convs.{i}.weight"], m[f"chars.convs.{i}.bias"] = (f"CNN/W_cnn_{i}", CONV), (f"CNN/b_cnn_{i}", SAME)
    for k in range(cfg.highway_layers):
        for part in ("transform", "carry"):
            m[f"chars.highways.{k}.{part}.weight"] = (f"CNN_high_{k}/W_{part}", TRANSPOSED)
            m[f"chars.highways.{k}.{part}.bias"] = (f"CNN_high_{k}/b_{part}", SAME)
    for d, stack in enumerate(DIRECTIONS):
        for layer in range(cfg.num_layers):
            at = LSTM.format(d=d, l=layer)
            m[f"{stack}.{layer}.state.bias"] = (at + "B", gates)
            m[f"{stack}.{layer}.projection.weight"] = (at + "W_P_0", TRANSPOSED)
    return m


def kernels(cfg: ModelConfig):
    """(ptm input weight, ptm recurrent weight, TF kernel name) of every LSTM."""
    for d, stack in enumerate(DIRECTIONS):
        for layer in range(cfg.num_layers):
            yield f"{stack}.{layer}.input.weight", f"{stack}.{layer}.state.weight", LSTM.format(d=d, l=layer) + "W_0"


def to_files(state: dict, cfg: ModelConfig) -> tuple[dict, dict[str, np.ndarray]]:
    """(options.json, weights.hdf5's datasets as float32 arrays) of a whole ELMo state dict."""
    state = {k: t[:cfg.vocab_size] if k.startswith("softmax.") else t for k, t in state.items()}
    out = {name: move[0](state[k]) for k, (name, move) in key_map(cfg).items()}
    for inputs, recurrent, name in kernels(cfg):
        out[name] = _gates(torch.cat([state[inputs], state[recurrent]], 1), cfg.ffn_hidden_size).T
    options = {"lstm": {"use_skip_connections": True, "projection_dim": cfg.hidden_size, "cell_clip": cfg.cell_clip,
                        "proj_clip": cfg.proj_clip, "dim": cfg.ffn_hidden_size, "n_layers": cfg.num_layers},
               "char_cnn": {"activation": cfg.activation, "filters": cfg.char_filters,
                            "n_highway": cfg.highway_layers, "embedding": {"dim": cfg.char_embedding_size},
                            "n_characters": 262, "max_characters_per_token": 50},
               "n_tokens_vocab": cfg.vocab_size}
    return options, {k: t.detach().float().contiguous().numpy() for k, t in out.items()}


def from_files(options: dict, weights: dict[str, np.ndarray], vocab_size: int = 0) -> tuple[ModelConfig, dict, list[str]]:
    """(the ptm model config, its state dict, the parameters the files lacked) of bilm-tf's options and weights
    (`vocab_size`: the vocabulary file's, where the weights have no softmax)."""
    try:
        lstm, cnn = options["lstm"], options["char_cnn"]
        if not lstm.get("use_skip_connections", False) and lstm["n_layers"] > 1:
            raise C.CheckpointError("options.json: use_skip_connections is false; ptm's ELMo (as AllenNLP's) adds "
                                    "each layer's input from the second layer on")
        vocab = len(weights["softmax/W"]) if "softmax/W" in weights else options.get("n_tokens_vocab") or vocab_size
        cfg = ModelConfig(arch="elmo", vocab_size=vocab, vocab_pad_to=1, hidden_size=lstm["projection_dim"],
                          ffn_hidden_size=lstm["dim"], num_layers=lstm["n_layers"], num_heads=1, type_vocab_size=0,
                          char_filters=[list(f) for f in cnn["filters"]], char_embedding_size=cnn["embedding"]["dim"],
                          highway_layers=cnn.get("n_highway", 0) or 0, cell_clip=lstm.get("cell_clip") or 0.0,
                          proj_clip=lstm.get("proj_clip") or 0.0, activation=cnn["activation"])
    except (KeyError, TypeError, AttributeError) as e:
        what = f"has no {e.args[0]!r}" if isinstance(e, KeyError) else "has another structure"
        raise C.CheckpointError(f"options.json {what}: it is not bilm-tf's ELMo options (lstm, char_cnn); pass the "
                                "options.json that came with weights.hdf5") from None
    lacking = [name for _, (name, _) in key_map(cfg).items() if name not in weights and not name.startswith("softmax/")]
    lacking += [name for _, _, name in kernels(cfg) if name not in weights]
    if lacking:
        raise C.CheckpointError(f"weights.hdf5 has no {lacking[0]} ({len(lacking)} datasets missing) that "
                                "options.json's model has: the two files are not one model's; pass the files exported "
                                "together")
    w = {k: torch.from_numpy(np.asarray(a, dtype=np.float32)) for k, a in weights.items()}
    state = {k: move[1](w[name]).contiguous() for k, (name, move) in key_map(cfg).items() if name in w}
    for inputs, recurrent, name in kernels(cfg):
        both = _gates(w[name].T, cfg.ffn_hidden_size)
        state[inputs], state[recurrent] = both[:, :-cfg.hidden_size].contiguous(), both[:, -cfg.hidden_size:].contiguous()
    missing = [k for k in ("softmax.weight", "softmax.bias") if k not in state]
    if missing:  # bilm-tf's published files: a new softmax, as a fresh model draws it
        from pretrain import models
        from pretrain.parallel import mcore

        torch.manual_seed(0)
        fresh = dict(models.build(cfg, tp=mcore.OneRank()).named_parameters())
        state.update({k: fresh[k].detach() for k in missing})
    return cfg, state, missing


def to_elmo(ckpt_or_run: str, out: str) -> str:
    """Write options.json, weights.hdf5 and the vocabulary of an ELMo checkpoint (or a run's latest) to `out`, whole
    beside it first (`whole_dir`: an earlier export there is replaced, a refused write or Ctrl-C leaves nothing)."""
    import h5py

    out = out.rstrip("/") or out
    if os.path.isdir(out) and os.listdir(out) and not os.path.isfile(os.path.join(out, "options.json")):
        raise C.CheckpointError(f"{out} holds files but no options.json: not ELMo files to replace; pass a new or "
                                "empty directory, or an earlier export")
    ckpt = C.check_complete(C.resolve(ckpt_or_run))
    cfg = C.model_config(C.read_meta(ckpt))
    if not cfg.char_filters:
        raise C.CheckpointError(f"{ckpt} holds model.arch={cfg.arch}, no character CNN; to-elmo writes ELMo's files "
                                f"(use to-hf)")
    options, weights = to_files(C.load_full_model(ckpt), cfg)
    with whole_dir(out) as tmp:
        os.makedirs(tmp)
        built = io.BytesIO()  # (HDF5 writing to a full disk itself ends the process in a segmentation fault)
        with h5py.File(built, "w") as f:
            for name, array in weights.items():
                f.create_dataset(name, data=array)
        write_bytes(os.path.join(tmp, "weights.hdf5"), built.getbuffer())
        write_json(os.path.join(tmp, "options.json"), options)
        for name in TOKENIZER_FILES:
            path = os.path.join(ckpt, "tokenizer", name)
            if os.path.isfile(path):
                copy_file(path, os.path.join(tmp, name))
    return out


def read_files(elmo_dir: str) -> tuple[dict, dict[str, np.ndarray]]:
    """options.json and every dataset of weights.hdf5 ({name: array}) in `elmo_dir`; a file that does not read is a
    CheckpointError naming it."""
    import h5py

    fix = "export it again (`ptm convert to-elmo`) or download the model's files again"
    path = os.path.join(elmo_dir, "options.json")
    try:
        with open(path) as f:
            options = json.load(f)
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not even text
        raise C.CheckpointError(f"{path} is unreadable ({str(e).splitlines()[0]}); {fix}") from None
    weights, path = {}, os.path.join(elmo_dir, "weights.hdf5")
    try:
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, node: weights.__setitem__(name, node[()]) if isinstance(node, h5py.Dataset)
                         else None)
    except OSError as e:  # h5py's truncated or foreign file: "Unable to synchronously open file (...)"
        raise C.CheckpointError(f"{path} is not a readable HDF5 file ({str(e).splitlines()[0]}): truncated or "
                                f"damaged; {fix}") from None
    return options, weights


def read_model(elmo_dir: str, vocab_size: int = 0) -> tuple[ModelConfig, dict, list[str]]:
    """`from_files` of the files in `elmo_dir`, its errors naming the directory."""
    options, weights = read_files(elmo_dir)
    try:
        return from_files(options, weights, vocab_size)
    except C.CheckpointError as e:
        raise C.CheckpointError(f"{elmo_dir}/{e}") from None


def from_elmo(elmo_dir: str, out: str) -> tuple[str, list[str]]:
    """A ptm checkpoint (step 0) from options.json + weights.hdf5 (+ vocab.txt); returns it and what was initialised."""
    from checkpoints_tools.hf import _params
    from checkpoints_tools.reshard import fresh

    for name in ("options.json", "weights.hdf5", "vocab.txt"):
        if not os.path.isfile(os.path.join(elmo_dir, name)):
            raise C.CheckpointError(f"{elmo_dir} has no {name}: an ELMo directory holds options.json, weights.hdf5 "
                                    f"and vocab.txt (bilm-tf's files, or `ptm convert to-elmo`)")
    with open(os.path.join(elmo_dir, "vocab.txt"), encoding="utf-8", errors="replace") as f:
        words = sum(1 for _ in f)
    cfg, state, missing = read_model(elmo_dir, words)
    with fresh(out) as tmp:
        os.makedirs(os.path.join(tmp, "tokenizer"))
        C.save_model(tmp, state)
        for name in TOKENIZER_FILES:
            path = os.path.join(elmo_dir, name)
            if os.path.isfile(path):
                copy_file(path, os.path.join(tmp, "tokenizer", name))
        meta = os.path.join(tmp, "tokenizer", "ptm_tokenizer.json")
        if not os.path.isfile(meta):
            from data_prep.tokenizer import load_tokenizer

            write_json(meta, {"kind": "words", "files": ["vocab.txt"], "lowercase": False})
            write_json(meta, load_tokenizer(os.path.join(tmp, "tokenizer")).meta())
        C.write_meta(tmp, model=cfg, params=_params(cfg, state), extra={"source": os.path.abspath(elmo_dir),
                                                                         "initialised": missing})
    return out, missing
