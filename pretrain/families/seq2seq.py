"""The Hugging Face conversion of an encoder-decoder (pretrain/models/seq2seq.py) as data: where a stack's blocks live
(`block`), the names of their attention linears (`self_attention`, `cross_attention`), the other block parameters
(`layer_keys`), the parameters outside the blocks (`keys`), and the tied copies (`tied`). A family (T5, BART) sets
them; the queries, keys and values are interleaved per head as ptm's fused layers hold them."""
from __future__ import annotations

import re

from pretrain.families.base import VOCAB_ROWS, Adapter, interleave_qkv, split_qkv, take

STACKS = ("encoder", "decoder")


class EncoderDecoderAdapter(Adapter):
    block = "{stack}.block.{i}."  # the HF prefix of block i of a stack
    self_attention = ""  # within a block: the HF name of the self-attention's q, k or v linear ({}: the letter)
    cross_attention = ""  # within a decoder block: the cross-attention's, alike
    letters = ("q", "k", "v")  # what {} takes for the query, key and value linears
    kinds = ("weight",)  # the attention linears' parameters (with biases: weight and bias)
    gated_key = ""  # part of an HF name that only a gated MLP has
    keys: dict = {}  # ptm parameter outside the blocks -> HF name
    tied: tuple = ()  # HF names that hold the word embeddings' tensor

    def layer_keys(self, stack: str, gated: bool) -> dict[str, str]:
        """ptm block parameter -> HF name within a block of `stack` (attention q/k/v apart: they are reshaped)."""
        raise NotImplementedError

    def key_map(self, layers: dict, gated: bool) -> dict[str, str]:
        m = dict(self.keys)
        for stack in STACKS:
            for i in range(layers[stack]):
                at = self.block.format(stack=stack, i=i)
                m.update({f"{stack}.blocks.{i}.{k}": at + v for k, v in self.layer_keys(stack, gated).items()})
        return m

    def from_hf(self, hf: dict, num_layers: int, num_heads: int, vocab_rows: int,
                task_types: bool = False) -> tuple[dict, list[str]]:
        layers = count_blocks(hf, self.block)
        gated = bool(self.gated_key) and any(self.gated_key in k for k in hf)
        out, missing = take(hf, self.key_map(layers, gated), vocab_rows)
        for stack in STACKS:
            for i in range(layers[stack]):
                at = self.block.format(stack=stack, i=i)
                for kind in self.kinds:
                    q, k, v = (hf[f"{at}{self.self_attention.format(n)}.{kind}"] for n in self.letters)
                    out[f"{stack}.blocks.{i}.attn.qkv.{kind}"] = interleave_qkv(q, k, v, num_heads).contiguous()
                    if stack == "decoder":
                        k, v = (hf[f"{at}{self.cross_attention.format(n)}.{kind}"] for n in self.letters[1:])
                        out[f"{stack}.blocks.{i}.cross.kv.{kind}"] = interleave_kv(k, v, num_heads).contiguous()
        return out, missing

    def to_hf(self, ours: dict, num_layers: int, num_heads: int, vocab_size: int) -> dict:
        layers = count_blocks(ours, "{stack}.blocks.{i}.")
        gated = any(".mlp.gate." in k for k in ours)
        out = {theirs: (ours[mine][:vocab_size] if mine in VOCAB_ROWS else ours[mine]).contiguous()
               for mine, theirs in self.key_map(layers, gated).items()}
        for stack in STACKS:
            for i in range(layers[stack]):
                at = self.block.format(stack=stack, i=i)
                for kind in self.kinds:
                    q, k, v = split_qkv(ours[f"{stack}.blocks.{i}.attn.qkv.{kind}"], num_heads)
                    out.update({f"{at}{self.self_attention.format(n)}.{kind}": t.contiguous()
                                for n, t in zip(self.letters, (q, k, v))})
                    if stack == "decoder":
                        k, v = split_kv(ours[f"{stack}.blocks.{i}.cross.kv.{kind}"], num_heads)
                        out.update({f"{at}{self.cross_attention.format(n)}.{kind}": t.contiguous()
                                    for n, t in zip(self.letters[1:], (k, v))})
        word = out[self.keys["embeddings.word.weight"]]
        out.update({copy: word for copy in self.tied})
        return out


def interleave_kv(k, v, heads: int):
    """[k; v] (each [hidden, ...]) -> the per-head layout [heads][2][head_dim, ...] of ptm's cross-attention kv."""
    import torch

    rest = k.shape[1:]
    return torch.stack([k, v]).view(2, heads, -1, *rest).transpose(0, 1).reshape(-1, *rest)


def split_kv(kv, heads: int):
    """Inverse of interleave_kv: -> (k, v)."""
    rest = kv.shape[1:]
    return kv.view(heads, 2, -1, *rest).transpose(0, 1).reshape(2, -1, *rest).unbind(0)


def count_blocks(state: dict, block: str) -> dict[str, int]:
    """Blocks per stack in a state dict's names, by the block prefix template `block`."""
    pattern = re.compile(re.escape(block).replace(r"\{stack\}", "(encoder|decoder)").replace(r"\{i\}", r"(\d+)"))
    found = dict.fromkeys(STACKS, 0)
    for key in state:
        if m := pattern.match(key):
            found[m.group(1)] = max(found[m.group(1)], int(m.group(2)) + 1)
    return found
