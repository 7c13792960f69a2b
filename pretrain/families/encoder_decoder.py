"""What the encoder-decoder families (T5, BART) share: their model (pretrain/models/seq2seq.py), its cost (the
decoder's stack and parameters) and its Hugging Face conversion as data: where a stack's blocks live (`block`), the
names of their attention linears (`self_attention`, `cross_attention`), the other block parameters (`layer_keys`),
the parameters outside the blocks (`keys`), and the tied copies (`tied`). A family sets them; the queries, keys and
values are interleaved per head as ptm's fused layers hold them. Not a family itself."""
from __future__ import annotations

import re

from pretrain.families.base import VOCAB_ROWS, Adapter, Cost, interleave_heads, split_heads, take
from pretrain.schema import opt
from pretrain.stacks import Stack

SECTION = (  # the model field the encoder-decoders (T5, BART) read: their config section
    ("decoder_layers", int, opt(0, "layers of a decoder stack that attends to the encoder's output through "
        "cross-attention (encoder-decoder models: T5, BART, MASS); 0: none", range=">= 0")),
)

STACKS = ("encoder", "decoder")


MODEL = "pretrain.models.seq2seq:EncoderDecoder"  # an encoder-decoder family's model


class EncoderDecoderCost(Cost):
    """The encoder's stack and the decoder's (model.decoder_layers, each block with cross-attention to the encoder's
    output), the decoder's final norm, position table, embedding LayerNorm and each stack's bucketed bias table."""

    def stacks(self, m, seq_len, decoder, predicted):
        return [Stack(m, m.num_layers, seq_len), Stack(m, m.decoder_layers, decoder or seq_len, seq_len)]

    def more_modules(self, m, layer, shared):
        h, a, norm = m.hidden_size, m.attention_width, shared["norm"]
        bias, qkv = (1 if m.bias else 0), (1 if m.bias and m.qkv_bias else 0)
        cross = [(0, norm), (h * a + a * qkv, 0), (2 * h * a + 2 * a * qkv, 0), (a * h, h * bias)]  # norm, q, kv, out
        out = (layer["norms"] + layer["attention"] + layer["mlp"] + cross) * m.decoder_layers
        out += [(0, norm)] if m.norm == "pre" else []
        out += [(0, shared["positions"])] + ([(0, shared["embedding_norm"])] if shared["embedding_norm"] else [])
        return out + [(m.relative_buckets * m.num_heads, 0)] * 2 if m.positional.score_bias else out


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
                    out[f"{stack}.blocks.{i}.attn.qkv.{kind}"] = interleave_heads((q, k, v), num_heads).contiguous()
                    if stack == "decoder":
                        k, v = (hf[f"{at}{self.cross_attention.format(n)}.{kind}"] for n in self.letters[1:])
                        out[f"{stack}.blocks.{i}.cross.kv.{kind}"] = interleave_heads((k, v), num_heads).contiguous()
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
                    q, k, v = split_heads(ours[f"{stack}.blocks.{i}.attn.qkv.{kind}"], num_heads)
                    out.update({f"{at}{self.self_attention.format(n)}.{kind}": t.contiguous()
                                for n, t in zip(self.letters, (q, k, v))})
                    if stack == "decoder":
                        k, v = split_heads(ours[f"{stack}.blocks.{i}.cross.kv.{kind}"], num_heads, 2)
                        out.update({f"{at}{self.cross_attention.format(n)}.{kind}": t.contiguous()
                                    for n, t in zip(self.letters[1:], (k, v))})
        word = out[self.keys["embeddings.word.weight"]]
        out.update({copy: word for copy in self.tied})
        return out


def count_blocks(state: dict, block: str) -> dict[str, int]:
    """Blocks per stack in a state dict's names, by the block prefix template `block`."""
    pattern = re.compile(re.escape(block).replace(r"\{stack\}", "(encoder|decoder)").replace(r"\{i\}", r"(\d+)"))
    found = dict.fromkeys(STACKS, 0)
    for key in state:
        if m := pattern.match(key):
            found[m.group(1)] = max(found[m.group(1)], int(m.group(2)) + 1)
    return found
