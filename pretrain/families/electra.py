"""ELECTRA (Clark et al. 2020): a BERT-shaped discriminator with a replaced-token-detection head and a generator
`model.generator_size` times as wide that reads its embeddings (pretrain/objectives/electra.py trains both). Exports
the discriminator as ElectraForPreTraining and the generator as ElectraForMaskedLM in its `generator/`
subdirectory, each with the shared embedding tables."""
from __future__ import annotations

from dataclasses import replace

from pretrain.families import bert
from pretrain.families.base import Cost, ExportError, Family, hf_common
from pretrain.schema import opt

ORDER = 60
SECTION = (  # the model field only ELECTRA reads: its config section
    ("generator_size", float, opt(0.0, "ELECTRA (heads [rtd]): the generator's width (hidden size, heads, MLP) as a "
        "fraction of the model's; it shares the model's embeddings (the paper: 1/4 to 1/2)",
        range="[0, 1]")),
)
FEATURES = dict(bert.FEATURES, heads=["rtd"])
GENERATOR = ("generator", "ElectraForMaskedLM")  # the generator's subdirectory and class
GENERATOR_SIZE = 0.25  # the generator made for a discriminator imported alone (ELECTRA-small's and -large's)
SHARED = ("embeddings.word.weight", "embeddings.position.weight", "embeddings.token_type.weight",
          "embeddings.norm.weight", "embeddings.norm.bias")  # the generator's, read from the discriminator


class ElectraAdapter(bert.BertAdapter):
    hf_class = "ElectraForPreTraining"
    model_type = "electra"
    prefix = "electra."
    keys = {**bert.EMBEDDINGS,  # one map for both models: each lacks the other's head
            "embeddings.proj.weight": "{p}embeddings_project.weight", "embeddings.proj.bias": "{p}embeddings_project.bias",
            "rtd.dense.weight": "discriminator_predictions.dense.weight",
            "rtd.dense.bias": "discriminator_predictions.dense.bias",
            "rtd.score.weight": "discriminator_predictions.dense_prediction.weight",
            "rtd.score.bias": "discriminator_predictions.dense_prediction.bias",
            "mlm.dense.weight": "generator_predictions.dense.weight", "mlm.dense.bias": "generator_predictions.dense.bias",
            "mlm.norm.weight": "generator_predictions.LayerNorm.weight",
            "mlm.norm.bias": "generator_predictions.LayerNorm.bias", "mlm.bias": "generator_lm_head.bias"}
    computes = {**{k: v for k, v in bert.COMPUTES.items() if k != "embedding_size"}, "heads": ("rtd", "mlm")}

    @property
    def tied(self):
        return {}

    def to_hf(self, ours, num_layers, num_heads, vocab_size):
        out = super().to_hf(ours, num_layers, num_heads, vocab_size)
        if "mlm.bias" in ours:  # the generator's output projection is its word embeddings
            out["generator_lm_head.weight"] = out["electra.embeddings.word_embeddings.weight"]
        return out

    shared = SHARED

    def models(self, cfg):
        if "mlm" in cfg.heads:  # a generator alone
            return [("", cfg, GENERATOR[1])]
        return [("", cfg, self.hf_class), (GENERATOR[0], generator_config(cfg), GENERATOR[1])]

    def split(self, state, cfg):
        """The discriminator's state and the generator's, each a whole model's (the generator gets the
        discriminator's embedding tables, which it reads in ptm)."""
        if "mlm" in cfg.heads:
            return [state]
        disc = {k: v for k, v in state.items() if not k.startswith("generator.")}
        gen = {k.removeprefix("generator."): v for k, v in state.items() if k.startswith("generator.")}
        return [disc, gen | {k: state[k] for k in SHARED if k in state}]

    def join(self, state, companion, subdirectory):
        joined = join(state, companion)
        return joined, [k for k in joined if k.startswith("generator.")]

    def read_model_config(self, hf_dir, hf, read):
        import os

        where = os.path.join(hf_dir, GENERATOR[0])
        generator = read(where)[1] if os.path.isfile(os.path.join(where, "config.json")) else None
        return self.model_config(hf, generator)

    def hf_config(self, cfg, special):
        import transformers

        cls = GENERATOR[1] if "mlm" in cfg.heads else self.hf_class
        return transformers.ElectraConfig(embedding_size=cfg.embedding_size or cfg.hidden_size,
                                          **hf_common(cfg, special, cls))

    def model_config(self, hf, generator=None):
        """The discriminator's config, sized with its `generator`'s HF config (without one, a generator of
        GENERATOR_SIZE)."""
        if GENERATOR[1] in (hf.architectures or []):
            raise ExportError(f"this is ELECTRA's generator ({GENERATOR[1]}); pass the discriminator's directory "
                              f"(ElectraForPreTraining), with the generator in its {GENERATOR[0]}/ subdirectory")
        fields = dict(super().model_config(hf), arch="electra", heads=["rtd"],
                      embedding_size=hf.embedding_size if hf.embedding_size != hf.hidden_size else 0,
                      generator_size=generator.hidden_size / hf.hidden_size if generator else GENERATOR_SIZE)
        if generator is not None:
            ours = generator_sizes(fields["hidden_size"], fields["num_heads"], fields["ffn_hidden_size"],
                                   fields["generator_size"])
            theirs = (generator.hidden_size, generator.num_attention_heads, generator.intermediate_size,
                      generator.num_hidden_layers, generator.embedding_size)
            if (*ours, fields["num_layers"], fields["embedding_size"] or fields["hidden_size"]) != theirs:
                raise ExportError(f"the generator's sizes (hidden, heads, MLP, layers, embedding: {theirs}) are not the "
                                  f"discriminator's scaled by {fields['generator_size']:.4g}; ptm's generator is "
                                  "model.generator_size times as wide and as deep, on the same embeddings")
        return fields

    def import_class(self, hf) -> str:
        return self.hf_class


def join(disc: dict, gen: dict) -> dict:
    """Inverse of `ElectraAdapter.split`: the generator's own parameters under `generator.` (its embedding tables are
    the discriminator's)."""
    return disc | {f"generator.{k}": v for k, v in gen.items() if k not in SHARED}


def generator_sizes(hidden: int, heads: int, ffn: int, fraction: float) -> tuple[int, int, int]:
    """(hidden size, heads, MLP width) of a generator `fraction` times as wide as a model of these sizes."""
    return round(hidden * fraction), max(1, round(heads * fraction)), round(ffn * fraction)


def generator_config(cfg):
    """ELECTRA's generator of a ModelConfig: a masked LM `generator_size` times as wide as the model (hidden size,
    heads, MLP), as deep, reading the model's embeddings (their width, projected to its own)."""
    hidden, heads, ffn = generator_sizes(cfg.hidden_size, cfg.num_heads, cfg.ffn_hidden_size, cfg.generator_size)
    return replace(cfg, hidden_size=hidden, num_heads=heads, ffn_hidden_size=ffn,
                   embedding_size=cfg.embedding_size or cfg.hidden_size,  # models.config.embedding_width (it
                   heads=["mlm"], generator_size=0.0)  # imports the families, so not imported here)


def wire(model) -> None:
    """What ELECTRA's model builds beyond the features' (`Family.wire`, called once the model's own layers are
    initialised): with the rtd head, its generator, a model of the same class on `generator_config`, reading the
    model's embedding tables and their LayerNorm (one copy)."""
    if "rtd" in model.cfg.heads:
        model.generator = type(model)(generator_config(model.cfg), tp=model.tp)
        model.generator.embeddings.share(model.embeddings)


def check(cfg, need, objective) -> None:
    """The rtd head and the generator come together, only in ELECTRA's model (`wire`), and the generator's sizes split
    over the heads and TP ranks."""
    m, tp = cfg.model, cfg.parallel.tp
    need("rtd" not in m.heads or m.arch == "electra",
         f"model.heads={m.heads} with model.arch={m.arch}: the rtd head trains with ELECTRA's generator, which "
         f"model.arch=electra builds; set model.arch=electra")
    need(("rtd" in m.heads) == (m.generator_size > 0),
         f"model.generator_size={m.generator_size} with model.heads={m.heads}: ELECTRA's rtd head trains with a "
         f"generator and only it has one; set model.generator_size to a fraction in (0, 1] with heads [rtd], else 0")
    if "rtd" in m.heads and 0 < m.generator_size <= 1:
        g = generator_config(m)
        need(g.hidden_size % g.num_heads == 0 and g.num_heads % tp == 0 and g.ffn_hidden_size % tp == 0,
             f"model.generator_size={m.generator_size} gives a generator of hidden size {g.hidden_size}, "
             f"{g.num_heads} heads and MLP width {g.ffn_hidden_size}, which parallel.tp={tp} and the heads must "
             f"divide; pick a fraction that keeps them whole (e.g. 1/4 or 1/3 of a 12-head model)")


class ElectraCost(Cost):
    def companions(self, m):
        """The generator, on the discriminator's embeddings."""
        return [generator_config(m)] if m.generator_size else []


FAMILY = Family("electra", "ELECTRA: a discriminator detecting the tokens a small generator replaced", FEATURES,
                ElectraAdapter(), check, cost=ElectraCost(), section=SECTION, wire=wire,
                vocab_rows=("generator.mlm.bias",))  # an import's (unpadded) is padded for checkpoint.init_from
