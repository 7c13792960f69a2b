"""ELMo (Peters et al. 2018, "Deep contextualized word representations"): a character CNN with highway layers and a
projection, a forward and a backward LSTM language model with projections, clipping and residual connections, one
softmax over the word vocabulary shared by both directions (pretrain/models/char_bilm.py); the bidirectional LM
objective (pretrain/objectives/bilm.py) on word datasets (`data_prep words`). Exports as bilm-tf's options.json +
weights.hdf5 + vocabulary, which AllenNLP's `Elmo` reads (checkpoints_tools/bilm_tf.py)."""
from __future__ import annotations

from pretrain.families.base import Command, Cost, Family, Format
from pretrain.schema import opt

ORDER = 130
SECTION = (  # the model fields only ELMo reads: its config section
    ("char_filters", list[list[int]], opt([], "ELMo: the character CNN's [width, filters] pairs (published: [[1, 32], "
        "[2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]); with them "
        "the model is ELMo's biLM: hidden_size is the LSTMs' projection, "
        "ffn_hidden_size their cell, num_layers each direction's layers")),
    ("char_embedding_size", int, opt(16, "ELMo: width of the character embeddings", range="> 0")),
    ("highway_layers", int, opt(0, "ELMo: highway layers after the character CNN", range=">= 0")),
    ("cell_clip", float, opt(0.0, "ELMo: the LSTM cells are clipped to [-cell_clip, cell_clip]; 0: not clipped",
        range=">= 0")),
    ("proj_clip", float, opt(0.0, "ELMo: the LSTMs' projected states are clipped likewise; 0: not clipped",
        range=">= 0")),
)
FEATURES = dict(norm="post", activation="relu", causal=False, heads=["lm"], scaled_init=False,  # lm: its softmax
                position_encoding="learned", share_layers="none")
CHARS = 262  # character ids (AllenNLP's): 0 a padding word, 1..256 a UTF-8 byte + 1, 257..261 begin and end of
# sentence, begin and end of word, padding inside a word
PUBLISHED_FILTERS = [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]]


def check(cfg, need, objective) -> None:
    """ELMo's model is its character CNN and LSTMs: the transformer's options do not apply, and only the softmax splits
    under tensor parallelism."""
    m = cfg.model
    if m.arch != "elmo":
        need(not m.char_filters, f"model.char_filters is ELMo's character CNN (model.arch=elmo), not "
                                 f"model.arch={m.arch}'s; remove it")
        return
    need(bool(m.char_filters) and all(len(f) == 2 and min(f) > 0 for f in m.char_filters),
         f"model.char_filters={m.char_filters} must be [width, filters] pairs of positive numbers; give them "
         f"(published: {PUBLISHED_FILTERS})")
    need(m.activation in ("relu", "tanh"), f"model.activation={m.activation}: ELMo's character CNN has relu or tanh; "
                                           "set model.activation=relu")
    need(cfg.data.objective == "bilm", f"data.objective={cfg.data.objective}: ELMo trains its biLM; set "
                                       f"data.objective=bilm")
    need(not m.activation_checkpointing, "model.activation_checkpointing recomputes transformer layers; ELMo has "
                                         "none: remove it")
    need(cfg.kernels != "compile", "kernels=compile compiles transformer blocks; ELMo has none: set kernels=auto")


class ElmoCost(Cost):
    """ELMo's biLM is no transformer: its parameters, FLOPs and activations, counted whole."""

    def modules(self, m):
        """Character embeddings, the CNN, highways, projection, each direction's LSTMs (input and recurrent gates with
        one bias, the projection) replicated; the shared softmax split by TP."""
        p, c, width = m.hidden_size, m.ffn_hidden_size, sum(n for _, n in m.char_filters)
        cnn = [(0, w * m.char_embedding_size * n + n) for w, n in m.char_filters]
        highways = [(0, 2 * (width * width + width))] * m.highway_layers
        lstms = [(0, p * 4 * c + p * 4 * c + 4 * c + c * p)] * (2 * m.num_layers)
        vocab = m.padded_vocab
        return [(0, CHARS * m.char_embedding_size), *cnn, *highways, (0, width * p + p), *lstms,
                (vocab * p + vocab, 0)]

    def flops(self, m, seq_len):
        """On a window of seq_len + 1 words (3 x forward, 2 per multiply-add): per word the character CNN (each filter
        of width w over the 51 - w positions of 50 characters), the highways and the projection, and in each
        direction each LSTM's gates (input and recurrent: 8PC) and projection (CP); per predicted word (seq_len in
        each direction) the softmax (PV)."""
        p, c, width, e = m.hidden_size, m.ffn_hidden_size, sum(n for _, n in m.char_filters), m.char_embedding_size
        word = (sum((51 - w) * w * e * n for w, n in m.char_filters) + 2 * m.highway_layers * width * width
                + width * p + 2 * m.num_layers * (8 * p * c + c * p))
        return 6.0 * ((seq_len + 1) * word + 2 * seq_len * p * m.padded_vocab)

    def launches(self, m, seq_len):
        """A micro-batch's launches: 159, 12 per character filter, 28 per highway, and per LSTM layer 16 plus 98 per
        word of the window (seq_len + 1: the LSTMs step word by word, both directions, forward and backward); the
        first micro-batch 2 per filter, 4 per highway and 8 per layer fewer, plus 17 (it assigns its gradients); the
        step's end 119, 8 per filter, 16 per highway, 32 per layer (counted: pretrain/launches.py on elmo-original and
        narrowed elmo-tiny; tests/test_launches.py holds them to a count)."""
        filters, highways, layers = len(m.char_filters), m.highway_layers, m.num_layers
        micro_batch = 159 + 12 * filters + 28 * highways + layers * (16 + 98 * (seq_len + 1))
        return (micro_batch + 17 - 2 * filters - 4 * highways - 8 * layers, micro_batch,
                119 + 8 * filters + 16 * highways + 32 * layers)

    def activation_bytes(self, cfg, micro_batch):
        """Per word the character embeddings and convolution outputs, each highway's three F-wide tensors, the
        projection; per word, direction and layer an LSTM step's gates before and after their activations (8C), its
        cell and tanh(cell) (2C), its output and the residual sum (2P); the softmax's fp32 logits of both directions
        over this rank's vocabulary (2 bytes per element in 16 bits counted as 2, fp32 4)."""
        m, b, words = cfg.model, micro_batch, cfg.data.seq_len + 1
        size = 4 if cfg.precision == "fp32" else 2
        p, c, width = m.hidden_size, m.ffn_hidden_size, sum(n for _, n in m.char_filters)
        word = (50 * m.char_embedding_size + sum(n * (51 - w) for w, n in m.char_filters)
                + 3 * width * m.highway_layers + width + p + 2 * m.num_layers * (10 * c + 2 * p))
        logits = 2 * b * cfg.data.seq_len * m.padded_vocab * 4 // cfg.parallel.tp
        return b * words * word * size, logits


BILM_TF = Format("elmo", "checkpoints_tools.bilm_tf", "bilm-tf files (options.json + weights.hdf5 + vocab.txt)",
                 writes="Write the files AllenNLP's Elmo reads (and the shared softmax, which it ignores).",
                 reads="Import bilm-tf's ELMo files (ptm's export, or a published model: its softmax, not in the "
                       "published files, is initialised and reported).",
                 source="a directory with options.json, weights.hdf5 and vocab.txt")

VECTORS = Command(
    "elmo", "ELMo representations of text: a scalar mix of a trained ELMo's layers",
    "Load an ELMo (a checkpoint, a run, or options.json + weights.hdf5) and print each word's vector norm in every "
    "layer and in the equal-weight mix (pretrain/elmo_vectors.py is the module a downstream model uses).",
    ((("path",), {"help": "a checkpoint, a training out_dir, or a directory with options.json + weights.hdf5"}),
     (("--text",), {"nargs": "+", "required": True, "help": "sentences, words separated by spaces"})),
    "pretrain.elmo_vectors:command")

FAMILY = Family("elmo", "ELMo: character CNN, forward and backward LSTM LMs with one softmax", FEATURES, None, check,
                model="pretrain.models.char_bilm:ELMo", cost=ElmoCost(), attends=False,
                section=SECTION, formats=(BILM_TF,), commands=(VECTORS,), vocab_rows=("softmax.weight", "softmax.bias"),
                export="export it with `ptm convert to-elmo` (bilm-tf's files, which AllenNLP reads)")
