"""ELMo representations for a downstream model (Peters et al. 2018, eq. 1): a task's ELMo vector for word k is
gamma * sum_j s_j * h_kj over the biLM's layers j (the word vectors, then each LSTM layer's forward and backward
states), s = softmax(w), with w and gamma learned with the task while the biLM stays frozen (AllenNLP's `ScalarMix`;
`layer_norm`: each layer normalised first, over all its unmasked elements). Each sentence is read between `<S>` and
`</S>`, as in pretraining, and those two are removed from the output. The LSTMs start every batch from zero states
(AllenNLP's Elmo carries them from batch to batch).

    elmo = ELMoEmbedder.load("runs/elmo-tiny")   # a checkpoint, a run, or a directory of options.json + weights.hdf5
    out = elmo([["The", "cat", "sat", "."], ["Hi"]])   # out["elmo"][0]: [batch, words, 2P], out["mask"]: [batch, words]

`python -m pretrain elmo PATH --text "..."` prints each word's vector norms, layer by layer and mixed.
"""
from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn

from pretrain.data.char_words import char_ids


class ScalarMix(nn.Module):
    """gamma * sum_j softmax(w)_j * layer_j, w starting equal (the mean of the layers) and gamma at 1."""

    def __init__(self, layers: int, layer_norm: bool = False):
        super().__init__()
        self.weights, self.gamma, self.layer_norm = nn.Parameter(torch.zeros(layers)), nn.Parameter(torch.ones(())), \
            layer_norm

    def forward(self, layers: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        s = torch.softmax(self.weights, 0)
        if self.layer_norm:
            m = mask[..., None].to(layers[0].dtype)
            count = m.sum() * layers[0].shape[-1]
            normed = []
            for x in layers:
                mean = (x * m).sum() / count
                var = (((x - mean) * m) ** 2).sum() / count
                normed.append((x - mean) / torch.sqrt(var + 1e-12))
            layers = normed
        return self.gamma * sum(w * x for w, x in zip(s, layers))


class ELMoEmbedder(nn.Module):
    """A frozen ELMo biLM (pretrain/models/char_bilm.py) and `mixes` scalar mixes of its layers (one per place a task
    uses ELMo)."""

    def __init__(self, bilm, mixes: int = 1, layer_norm: bool = False):
        super().__init__()
        self.bilm = bilm.eval()
        for p in self.bilm.parameters():
            p.requires_grad_(False)
        self.mixes = nn.ModuleList(ScalarMix(bilm.cfg.num_layers + 1, layer_norm) for _ in range(mixes))

    @classmethod
    def load(cls, path: str, mixes: int = 1, layer_norm: bool = False) -> "ELMoEmbedder":
        """From a ptm checkpoint (or a run's latest) or a directory of bilm-tf's options.json + weights.hdf5; anything
        else is a CheckpointError naming it."""
        from pretrain import checkpoint as C
        from pretrain import models
        from pretrain.models.char_bilm import ELMo
        from pretrain.parallel import mcore

        takes = ("an ELMo checkpoint or run (model.arch=elmo), or a directory of bilm-tf's options.json + "
                 "weights.hdf5 (`ptm convert to-elmo`)")
        if os.path.isfile(os.path.join(path, "options.json")):
            from checkpoints_tools.bilm_tf import read_model

            cfg, state, _ = read_model(path, 1)
        else:
            try:
                ckpt = C.resolve(path)
            except C.CheckpointError:
                raise C.CheckpointError(f"{path} holds no ELMo; pass {takes}") from None
            cfg = C.model_config(C.read_meta(C.check_complete(ckpt)))
            if not issubclass(models.model_class(cfg), ELMo):  # the model its family builds
                raise C.CheckpointError(f"{ckpt} holds model.arch={cfg.arch}, not an ELMo; pass {takes}")
            state = C.load_full_model(ckpt)
        cfg.hidden_dropout = 0.0
        bilm = ELMo(cfg, tp=mcore.OneRank())
        bilm.load_state_dict({k: v[:len(bilm.state_dict()[k])] for k, v in state.items()})
        return cls(bilm, mixes, layer_norm)

    def forward(self, sentences: list[list[str]]) -> dict:
        """{"elmo": one [batch, words, 2P] tensor per mix, "mask": [batch, words] (True on real words), "layers": the
        biLM's layers [batch, words, 2P] each}, without the sentence boundaries."""
        layers, mask = self.layers(sentences)
        return {"elmo": [mix(layers, mask) for mix in self.mixes], "mask": mask, "layers": layers}

    def layers(self, sentences: list[list[str]]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The biLM's layers ([batch, words, 2P] each, zero past a sentence's end) and the mask of real words."""
        lengths = [len(s) + 2 for s in sentences]
        device = next(self.bilm.parameters()).device
        chars = torch.zeros(len(sentences), max(lengths), 50, dtype=torch.long)
        for i, words in enumerate(sentences):
            chars[i, :lengths[i]] = torch.as_tensor(np.stack([char_ids(w) for w in ["<S>", *words, "</S>"]]))
        with torch.no_grad():
            layers = self.bilm.layers(chars.to(device), torch.tensor(lengths, device=device))
        n = max(lengths) - 2
        layers = [x[:, 1:n + 1] for x in layers]
        mask = torch.arange(n, device=device)[None] < torch.tensor(lengths, device=device)[:, None] - 2
        return [x * mask[..., None] for x in layers], mask


def command(args) -> str:
    """`ptm elmo PATH --text ...` (the ELMo family's `Command`)."""
    return describe(args.path, args.text)


def describe(path: str, text: list[str]) -> str:
    """Each word's vector norm in every layer and in the (initial, equal-weight) mix, one table per sentence."""
    elmo = ELMoEmbedder.load(path)
    sentences = [t.split() for t in text]
    with torch.no_grad():
        out = elmo(sentences)
    lines = []
    for i, words in enumerate(sentences):
        header = ["word"] + [f"layer {j}" for j in range(len(out["layers"]))] + ["mix"]
        lines.append("  ".join(f"{h:>10}" for h in header))
        for k, w in enumerate(words):
            norms = [float(x[i, k].norm()) for x in out["layers"]] + [float(out["elmo"][0][i, k].norm())]
            lines.append("  ".join([f"{w[:10]:>10}"] + [f"{v:10.3f}" for v in norms]))
    return "\n".join(lines)
