"""Scores without fine-tuning.

- Perplexity of a causal model on a text file (one document per line, or a JSONL file of {"text"}): the documents
  joined, each followed by the end-of-text token where the tokenizer has one, read in windows of the model's length
  that overlap by half, each token scored once with the most context it can have (the transformers docs' recipe).
- Last-word accuracy in the LAMBADA style (Paperno et al. 2016) on local data: each line's (or JSONL "text"'s) last
  word is the target; a hit is every piece of it being the model's greedy choice given the passage before it
  (lm-eval's `is_greedy`), and the targets' perplexity is reported beside it.
- Cloze scoring of an MLM model on a classification task (PET, Schick & Schuetze 2021, without training): the task's
  `cloze.pattern` with as many masks as the verbaliser word has pieces (a long text loses its start, never the
  masks); each label scores the mean log-probability of its word's pieces at the masks; the best label wins.
"""
from __future__ import annotations

import json
import math
import os

import torch

from downstream import TaskError
from downstream import models as M
from downstream.tasks import text_of


def read_texts(path: str) -> list[str]:
    """The documents of a text file (one per non-empty line) or a JSONL file ({"text": ...} per line)."""
    out = []
    if not os.path.isfile(path):
        raise TaskError(f"{path} is not a file; give a text file (one document per line) or JSONL with \"text\"")
    for n, line in enumerate(text_of(path).split("\n"), 1):
        if not line.strip():
            continue
        if path.endswith((".jsonl", ".json")):
            try:
                out.append(str(json.loads(line)["text"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise TaskError(f"{path}:{n}: not a JSON object with a \"text\" field; write one "
                                "{\"text\": ...} per line (or use a .txt file, one document per line)") from None
        else:
            out.append(line.rstrip("\r"))
    if not out:
        raise TaskError(f"{path}: no text; give one document per line")
    return out


def check(source: M.Source, causal: bool, cloze: bool) -> None:
    """Refuse, before any fine-tuning, zero-shot scores `source` cannot give: perplexity and last word (`causal`)
    of a model that is not a causal LM, cloze of one without an MLM head."""
    if causal and not M.causal(source):
        raise TaskError(f"{source.path}: perplexity and last-word accuracy need a causal language model (GPT, GPT-2, "
                        f"GPT-3, Transformer-XL); this is {source.family or 'an unknown family'}")
    if cloze:
        _mlm_dir(source)


def _causal_lm(source: M.Source):
    import transformers

    check(source, causal=True, cloze=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(source.hf_dir).eval()
    return model, M.tokenizer(source)


def _window(model, tok) -> int:
    """The model's positions, else the tokenizer's length (set on export; XLNetConfig, without a table, says -1)."""
    limits = (getattr(model.config, k, None) for k in ("n_positions", "max_position_embeddings"))
    return next((n for n in limits if n and n > 0), M.max_len(tok, 1024))


@torch.no_grad()
def perplexity(source: M.Source, path: str, max_len: int = 0) -> dict:
    model, tok = _causal_lm(source)
    eos = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
    ids = []
    for text in read_texts(path):
        ids += tok(text, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
    ids = torch.tensor(ids)
    n = min(max_len or _window(model, tok), _window(model, tok))
    stride = max(n // 2, 1)
    nll, count, prev_end = 0.0, 0, 0
    for begin in range(0, max(len(ids) - 1, 1), stride):
        end = min(begin + n, len(ids))
        chunk = ids[begin:end][None]
        logits = model(input_ids=chunk).logits[0, :-1].float()
        targets = chunk[0, 1:]
        fresh = max(end - max(prev_end, begin + 1), 0)  # tokens not scored by an earlier window
        lp = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
        nll -= float(lp[-fresh:].sum()) if fresh else 0.0
        count += fresh
        prev_end = end
        if end == len(ids):
            break
    return {"perplexity": math.exp(nll / max(count, 1)), "tokens": count}


def last_word_split(text: str) -> tuple[str, str]:
    """A passage's context and its last word (with the space before it), the punctuation after that word left out,
    as LAMBADA's passages end in the word; ("", "") for a passage of one word."""
    text = text.rstrip(".!?\"'”’ \t")
    cut = text.rfind(" ")
    return (text[:cut], text[cut:]) if cut > 0 else ("", "")


@torch.no_grad()
def last_word(source: M.Source, path: str) -> dict:
    model, tok = _causal_lm(source)
    window = _window(model, tok)
    hits, nll, pieces, n = 0, 0.0, 0, 0
    for text in read_texts(path):
        context, target = last_word_split(text)
        if not context:
            continue
        ctx = tok(context, add_special_tokens=False)["input_ids"]
        tgt = tok(context + target, add_special_tokens=False)["input_ids"][len(ctx):]
        if not tgt:
            continue
        ids = torch.tensor((ctx + tgt)[-window:])[None]
        logits = model(input_ids=ids).logits[0, -len(tgt) - 1:-1].float()
        t = torch.tensor(tgt)
        hits += int(bool((logits.argmax(-1) == t).all()))
        nll -= float(torch.log_softmax(logits, -1).gather(1, t[:, None]).sum())
        pieces += len(tgt)
        n += 1
    if n == 0:
        raise TaskError(f"{path}: no passage has a last word after some context; give passages of several words")
    return {"accuracy": hits / n, "target_perplexity": math.exp(nll / pieces), "passages": n}


def _mlm_dir(source: M.Source) -> str:
    """The directory of `source`'s model with an MLM head."""
    import transformers

    if not source.hf_dir:  # ELMo
        raise TaskError(f"{source.path}: cloze scoring needs a masked language model head; {source.family} has none")
    hf_dir = source.hf_dir
    generator = os.path.join(hf_dir, "generator")  # ELECTRA: the discriminator has no MLM head, its generator has
    if os.path.isfile(os.path.join(generator, "config.json")):
        hf_dir = generator
    config = transformers.AutoConfig.from_pretrained(hf_dir, trust_remote_code=True)
    if type(config) not in transformers.AutoModelForMaskedLM._model_mapping and not getattr(config, "auto_map", None):
        raise TaskError(f"{source.path}: cloze scoring needs a masked language model head; {config.model_type} has "
                        "none in transformers")
    if config.is_encoder_decoder:
        raise TaskError(f"{source.path}: cloze scoring reads an MLM head at the masks; {config.model_type} is an "
                        "encoder-decoder (fine-tune it instead)")
    return hf_dir


def _mlm(source: M.Source):
    import transformers

    hf_dir = _mlm_dir(source)
    model = transformers.AutoModelForMaskedLM.from_pretrained(hf_dir, trust_remote_code=True).eval()
    return model, transformers.AutoTokenizer.from_pretrained(hf_dir)


def _fitted(tok, pattern: str, fields: dict, mask: str, max_len: int) -> str:
    """`pattern` filled in, its longest text cut (the part nearest the masks kept) until the prompt fits `max_len`
    tokens: the masks are never cut, wherever the pattern puts them."""
    fields = dict(fields)
    for _ in range(16):
        prompt = pattern.format(**fields, mask=mask)
        over = len(tok(prompt)["input_ids"]) - max_len
        named = [k for k in ("text", "text_a", "text_b") if "{" + k + "}" in pattern and fields[k]]
        if over <= 0 or not named:
            return prompt
        k = max(named, key=lambda name: len(fields[name]))
        spans = tok(fields[k], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        keep = max(len(spans) - over, 0)
        before = pattern.index("{" + k + "}") < pattern.index("{mask}")  # (keep its end, next to the masks)
        fields[k] = (fields[k][spans[-keep][0]:] if before else fields[k][:spans[keep - 1][1]]) if keep else ""
    return pattern.format(**fields, mask=mask)


@torch.no_grad()
def cloze(source: M.Source, task, max_len: int = 128) -> dict:
    """Zero-shot accuracy (and the task's other metrics) of the cloze pattern on the task's dev set."""
    from downstream.finetune import score

    if not task.cloze:
        raise TaskError(f"task {task.name} has no `cloze` (pattern and verbalizer) in its task.yaml")
    model, tok = _mlm(source)
    if tok.mask_token_id is None:
        raise TaskError(f"{source.path}: its tokenizer has no mask token")
    max_len = M.max_len(tok, max_len)
    pattern, verbalizer = task.cloze["pattern"], task.cloze["verbalizer"]
    words = {lab: tok(" " + verbalizer[lab], add_special_tokens=False)["input_ids"] for lab in task.labels}
    preds = []
    for e in task.dev:
        fields = {"text": e.texts[0], "text_a": e.texts[0], "text_b": e.texts[-1]}
        scores = {}
        for lab, ids in words.items():
            enc = tok(_fitted(tok, pattern, fields, tok.mask_token * len(ids), max_len), truncation=True,
                      max_length=max_len, return_tensors="pt")
            where = (enc["input_ids"][0] == tok.mask_token_id).nonzero()[:, 0]
            logp = torch.log_softmax(model(**enc).logits[0, where[:len(ids)]].float(), -1)
            scores[lab] = float(logp.gather(1, torch.tensor(ids)[:, None]).mean())
        preds.append(max(scores, key=scores.get))
    return {**score(task, task.dev, preds), "pattern": pattern, "verbalizer": verbalizer,
            "pieces": {lab: len(ids) for lab, ids in words.items()}}
