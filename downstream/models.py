"""What `ptm eval` fine-tunes: a Hugging Face directory (any family ptm exports), a ptm run or checkpoint (exported
first, into the results directory), or an ELMo (a run, or bilm-tf's files).

Each task kind takes the family's own transformers head (`*ForSequenceClassification`, `*ForTokenClassification`,
`*ForQuestionAnswering`: GPT's reads the last token, T5's and BART's their decoder's end-of-sequence state). Where
transformers has none (OpenAI GPT's tagging and QA, BART's tagging, NEZHA's, whose modeling file ptm writes), a
linear layer over the base model's last hidden states (`LinearHead`: the first token's state for classification, the
last real token's for a causal model) stands in, and the results say so.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
from torch import nn

from downstream import TaskError
from ptm.files import save_pretrained, save_safetensors

AUTO = {"classification": "AutoModelForSequenceClassification", "regression": "AutoModelForSequenceClassification",
        "tagging": "AutoModelForTokenClassification", "qa": "AutoModelForQuestionAnswering"}


@dataclass
class Source:
    """A model to evaluate: `hf_dir` (a transformers directory) or `elmo` (what ELMoEmbedder.load reads)."""
    path: str
    hf_dir: str = ""
    elmo: str = ""
    family: str = ""  # the ptm family, where known

    @property
    def name(self) -> str:
        return os.path.basename(os.path.normpath(self.path))


def resolve(path: str, work_dir: str) -> Source:
    """`path` as a Source; a ptm run or checkpoint with a Hugging Face class is exported into WORK_DIR/export
    (again only when its checkpoint changed)."""
    from pretrain import checkpoint as C
    from pretrain import families

    if os.path.isfile(os.path.join(path, "config.json")):
        with open(os.path.join(path, "config.json")) as f:
            model_type = json.load(f).get("model_type", "")
        family = families.by_model_type(model_type)
        return Source(path, hf_dir=path, family=family.name if family else "")
    if os.path.isfile(os.path.join(path, "options.json")):
        return Source(path, elmo=path, family="elmo")
    if not os.path.isdir(path):
        raise TaskError(f"{path}: {'not a directory' if os.path.exists(path) else 'no such directory'}; pass a ptm "
                        "run's out_dir or checkpoint, or a Hugging Face (config.json) or ELMo (options.json) export")
    try:
        ckpt = C.check_complete(C.resolve(path))
    except C.CheckpointError as e:
        raise TaskError(f"{path} holds no Hugging Face (config.json) or ELMo (options.json) export, and as a ptm run "
                        f"or checkpoint: {e}") from None
    cfg = C.model_config(C.read_meta(ckpt))
    family = families.get(cfg.arch)
    if family.adapter is None:
        if not family.attends:  # ELMo: its own embedder under a task model
            return Source(path, elmo=ckpt, family=family.name)
        raise TaskError(f"{path}: model.arch={cfg.arch} has no Hugging Face class to fine-tune; {family.export}")
    out = os.path.join(work_dir, "export")
    stamp = os.path.join(out, "ptm_source.json")
    source = {"checkpoint": os.path.abspath(ckpt)}
    if not (os.path.isfile(stamp) and json.load(open(stamp)) == source):
        from checkpoints_tools import hf
        from ptm.files import write_json

        hf.to_hf(ckpt, out)  # (replaces an export of another checkpoint whole)
        write_json(stamp, source)
    return Source(path, hf_dir=out, family=family.name)


def causal(source: Source) -> bool:
    """A left-to-right language model (its family's adapter says so: GPT, GPT-2, GPT-3; or Transformer-XL's export):
    perplexity and last words."""
    from pretrain import families

    return bool(source.family and families.get(source.family).adapter
                and families.get(source.family).adapter.causal) or unmasked(source)


def trusted(source: Source) -> bool:
    """A directory ptm exported (its modeling file, NEZHA's, is ptm's own): transformers may run its code."""
    return os.path.isfile(os.path.join(source.hf_dir, "ptm_tokenizer.json"))


def unmasked(source: Source) -> bool:
    """A left-to-right XLNet (Transformer-XL's export, `attn_type: uni`): transformers' XLNet cannot add a padding
    mask to its causal mask for more than one sequence (an in-place broadcast fails), so it reads right-padded
    batches without a mask (causal attention never sees the padding after a token) and classifies from the last
    real token (`LinearHead`; XLNet's own head reads the last position, a pad). ELMo (no transformers model): no."""
    if not source.hf_dir:
        return False
    with open(os.path.join(source.hf_dir, "config.json")) as f:
        return json.load(f).get("attn_type") == "uni"


def max_len(tok, wanted: int) -> int:
    """`wanted`, or fewer where the model reads fewer positions (the tokenizer's model_max_length, set on export)."""
    limit = tok.model_max_length
    return min(wanted, limit) if isinstance(limit, int) and limit < 1 << 30 else wanted


def tokenizer(source: Source):
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(source.hf_dir, trust_remote_code=trusted(source))
    if unmasked(source):
        tok.padding_side = "right"
    return tok


def head_model(source: Source, kind: str, labels: int, pretrained: bool = True, names: list[str] = (),
               features: str = "") -> nn.Module:
    """The model fine-tuned on a task of `kind` with `labels` outputs (1 for regression): the family's transformers
    head, or a `LinearHead` over its base model; `pretrained=False`: the same architecture, randomly initialised
    (the baseline that shows what pretraining bought). `names`: the labels, saved in the config. `features`
    (first | mean | whiten): feature-based, a `LinearHead` over the frozen base model's vectors."""
    import transformers

    trust = trusted(source)
    config = transformers.AutoConfig.from_pretrained(source.hf_dir, trust_remote_code=trust)
    tok = tokenizer(source)
    if getattr(config, "pad_token_id", None) is None:  # GPT's last-token pooling finds the last non-pad token
        config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    names = list(names) if len(names) == labels else [str(i) for i in range(labels)]
    config.id2label, config.label2id = dict(enumerate(names)), {n: i for i, n in enumerate(names)}  # (sets num_labels)
    if kind == "regression":
        config.problem_type = "regression"
    auto = getattr(transformers, AUTO[kind])
    own_head = type(config) in auto._model_mapping and not (unmasked(source) and kind in ("classification",
                                                                                          "regression"))
    if own_head and not features:
        if pretrained:
            return HFHead(auto.from_pretrained(source.hf_dir, config=config), kind)
        torch_dtype = getattr(config, "dtype", None)
        return HFHead(auto.from_config(config, dtype=torch_dtype), kind)
    base_auto = transformers.AutoModel
    base = base_auto.from_pretrained(source.hf_dir, config=config, trust_remote_code=trust) if pretrained \
        else base_auto.from_config(config, trust_remote_code=trust)
    why = f"frozen features: {features}" if features else \
        "XLNet's own head reads the last position, a pad here" if unmasked(source) else \
        "transformers has no head of this kind for it"
    return LinearHead(base, kind, labels, causal(source), why, features)


def head_name(model: nn.Module) -> str:
    """What the results call the model fine-tuned."""
    if isinstance(model, HFHead):
        return type(model.model).__name__
    if isinstance(model, LinearHead):
        return f"LinearHead over {type(model.base).__name__} ({model.why})"
    return "ELMo (frozen, learned scalar mix) + BiLSTM task model"


class HFHead(nn.Module):
    """A transformers head model, called with the batch's inputs; returns its logits (QA: start and end)."""

    def __init__(self, model: nn.Module, kind: str):
        super().__init__()
        self.model, self.kind = model, kind

    def forward(self, inputs: dict):
        out = self.model(**{k: v for k, v in inputs.items() if k != "real"})
        return (out.start_logits, out.end_logits) if self.kind == "qa" else out.logits

    def save(self, out: str, tok) -> None:
        save_pretrained(self.model, out)
        tok.save_pretrained(out)


class LinearHead(nn.Module):
    """Dropout and a linear layer over a base model's last hidden states: for a text, its first token (a causal
    model's last real token); for tagging, every token; for QA, start and end logits per token.

    `features` makes it feature-based (the base frozen, in eval mode, only the linear layer trained) and names the
    text's vector: `first` (the token above), `mean` (the mean over real tokens), `whiten` (the mean, shifted and
    rotated to zero mean and identity covariance over the training texts: BERT-whitening, Su et al. 2021;
    `fit_inputs`)."""

    def __init__(self, base: nn.Module, kind: str, labels: int, last_token: bool, why: str = "", features: str = ""):
        super().__init__()
        width = base.config.hidden_size
        self.base, self.kind, self.last_token, self.why, self.features = base, kind, last_token, why, features
        self.dropout = nn.Dropout(0.1)
        self.out = nn.Linear(width, 2 if kind == "qa" else labels)
        nn.init.normal_(self.out.weight, std=0.02)
        nn.init.zeros_(self.out.bias)
        if features:
            base.requires_grad_(False)
            self.register_buffer("shift", torch.zeros(width))
            self.register_buffer("rotate", torch.eye(width))

    def train(self, mode: bool = True):
        super().train(mode)
        if self.features:
            self.base.eval()  # frozen features: no dropout inside the base
        return self

    def states(self, inputs: dict) -> torch.Tensor:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.features):
            return self.base(**{k: v for k, v in inputs.items() if k != "real"}).last_hidden_state

    def vector(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """A text's vector from its states `h` and real-token `mask`."""
        if self.features in ("mean", "whiten"):
            v = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
            return (v - self.shift) @ self.rotate if self.features == "whiten" else v
        at = (mask.cumsum(1).argmax(1) if self.last_token else mask.argmax(1))  # last / first real token
        return h[torch.arange(len(h)), at]

    def forward(self, inputs: dict):
        h = self.dropout(self.states(inputs))
        if self.kind == "qa":
            start, end = self.out(h).unbind(-1)
            return start, end
        if self.kind == "tagging":
            return self.out(h)
        return self.out(self.vector(h, inputs.get("attention_mask", inputs.get("real"))))

    @torch.no_grad()
    def fit_inputs(self, batches) -> None:
        """`whiten`'s shift and rotation from the mean vectors of `batches` (the training texts' model inputs): mu and
        U diag(s)^-1/2 of their covariance U diag(s) U^T (float64; tiny eigenvalues floored). Nothing otherwise."""
        if self.features != "whiten" or self.kind in ("tagging", "qa"):
            return
        was, self.features = self.features, "mean"
        v = torch.cat([self.vector(self.states(b), b.get("attention_mask", b.get("real"))) for b in batches]).double()
        self.features = was
        s, u = torch.linalg.eigh(torch.cov(v.T))
        self.shift.copy_(v.mean(0))
        self.rotate.copy_(u * s.clamp_min(s.max() * 1e-6).rsqrt())

    def save(self, out: str, tok) -> None:
        save_pretrained(self.base, out)
        tok.save_pretrained(out)
        head = {k: v.contiguous() for k, v in self.state_dict().items() if not k.startswith("base.")}
        save_safetensors(head, os.path.join(out, "head.safetensors"))
