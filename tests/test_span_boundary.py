"""SpanBERT's span boundary objective (pretrain/objectives/span_boundary.py): the boundaries against a scan of every
token, the SBO term against a float64 reference written out by hand, and a short run that evaluates the held-out SBO
accuracy beside the MLM accuracy and the unigram guess, then exports as BertForMaskedLM (the SBO head stays in ptm's
checkpoint). Its layouts are tests/test_fidelity.py's ("spanbert")."""
import functools
import math

import pytest
import torch

from pretrain.objectives.span_boundary import IGNORE, boundaries

COMMON = ["data.seq_len=32", "model.max_position_embeddings=32", "train.global_batch_size=8",
          "train.micro_batch_size=4", "optimizer.warmup_steps=1", "checkpoint.interval=0", "data.num_workers=0", "data.valid_fraction=0.1",
          "train.log_interval=1"]


def scanned(labels, segments, max_targets):
    """`boundaries` by walking each row: a masked token's span runs to the nearest unmasked tokens on either side;
    it gets the SBO term if both lie inside its sample and are not the sample's first or last token."""
    b, s = labels.shape
    sbo = torch.zeros(b, s, dtype=torch.bool)
    found = {}
    for r in range(b):
        for i in range(s):
            if labels[r, i] == IGNORE:
                continue
            left, right = i, i
            while left >= 0 and labels[r, left] != IGNORE:
                left -= 1
            while right < s and labels[r, right] != IGNORE:
                right += 1
            seg = segments[r, i]
            ok = (left >= 1 and right + 1 < s and segments[r, left - 1] == seg and segments[r, right + 1] == seg
                  and i - left - 1 < max_targets)
            sbo[r, i] = ok
            found[r, i] = (left, right, i - left - 1)
    return sbo, found


def batch_of(seed: int, b: int = 3, s: int = 40, packed: bool = False):
    """Random spans of masked tokens over rows of [CLS] ... [SEP] samples: padded rows, or packed rows of several."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.full((b, s), IGNORE)
    segments = torch.zeros(b, s, dtype=torch.long)
    for r in range(b):
        at, sample = 0, 1
        while at < s - 4:
            length = int(torch.randint(4, s if not packed else 16, (), generator=g)) if at or packed else s - 5 * r
            end = min(at + length, s)
            segments[r, at:end] = sample
            inner = torch.rand(end - at - 2, generator=g) < 0.35  # never the sample's first or last token
            labels[r, at + 1:end - 1][inner] = torch.randint(5, 50, (int(inner.sum()),), generator=g)
            at, sample = end, sample + 1
            if not packed:
                break
    return labels, segments


def test_boundaries_are_the_nearest_unmasked_tokens_inside_the_sample():
    seen = set()
    for seed in range(6):
        labels, segments = batch_of(seed, packed=seed % 2 == 1)
        for max_targets in (2, 15):
            sbo, left, right, place = boundaries(labels, segments, max_targets)
            want, found = scanned(labels, segments, max_targets)
            assert torch.equal(sbo, want)
            for (r, i), (lo, hi, p) in found.items():
                assert (left[r, i], right[r, i], place[r, i]) == (lo, hi, p)
            masked = labels != IGNORE
            seen |= {"edge" if (masked & ~sbo).any() else "", "long" if (place[masked] >= max_targets).any() else ""}
    assert seen >= {"edge", "long"}  # spans at the samples' edges and past max_targets were among them


def gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def layer_norm(x, norm):
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def test_the_sbo_term_matches_a_float64_reference():
    """The term `compute` returns (summed cross-entropy, count, correct) against the head written out in float64 from
    its weights: [h_left; h_right; place embedding] -> two Linear + GeLU + LayerNorm -> the tied word embeddings
    plus the SBO bias, over the vocabulary (not its padding rows), on every masked token that has the term."""
    from pretrain import models, objectives
    from pretrain.config import load
    from pretrain.parallel import mcore

    cfg = load("spanbert-tiny", ["model.vocab_size=60", "data.seq_len=40", "sbo.max_targets=3",
                                 "model.hidden_dropout=0", "model.attention_dropout=0"])
    objective = objectives.get("mlm_sbo").configured(cfg)
    mcore.initialize(1, 0)
    torch.manual_seed(0)
    model = models.build(cfg.model, heads=functools.partial(objective.heads, cfg)).double().eval()
    torch.nn.init.normal_(model.sbo.bias, std=0.5)  # (zero at the start: a wrong bias would not show)
    labels, segments = batch_of(3)
    ids = torch.randint(5, 60, labels.shape, generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids, "attention_mask": (segments > 0).long(), "token_type_ids": torch.zeros_like(ids),
             "labels": labels}
    with torch.no_grad():
        term = objective.compute(model, batch)["sbo"]
        h = model(ids, batch["attention_mask"], batch["token_type_ids"], hidden=True)["hidden"]
    head, word = model.sbo, model.embeddings.word.weight[:60]
    loss, count, correct = 0.0, 0, 0
    with torch.no_grad():  # the reference, in float64
        sbo, found = scanned(labels, segments, 3)
        for (r, i), (left, right, place) in found.items():
            if not sbo[r, i]:
                continue
            x = torch.cat([h[r, left], h[r, right], head.place.weight[place]])
            x = layer_norm(gelu(x @ head.fc1.weight.T + head.fc1.bias), head.norm1)
            y = layer_norm(gelu(x @ head.fc2.weight.T + head.fc2.bias), head.norm2)
            logits = y @ word.T + head.bias[:60]
            loss += float(torch.logsumexp(logits, 0) - logits[labels[r, i]])  # float64 throughout
            count += 1
            correct += int(logits.argmax() == labels[r, i])
    assert count > 5 and int(term.count) == count and int(term.correct) == correct
    assert float(term.loss) == pytest.approx(loss, rel=1e-6)  # (the vocab-parallel cross-entropy runs in fp32)


def test_a_run_evaluates_sbo_beside_mlm_and_exports_as_bert_for_masked_lm(train_data, tmp_path):
    """A short run logs the held-out SBO accuracy beside the MLM accuracy and their unigram guesses; `to-hf` writes a
    BertForMaskedLM whose logits are ptm's MLM head's, without the SBO head, which the checkpoint keeps."""
    import json

    import transformers
    from conftest import call_cli, read_jsonl, run_cli
    from safetensors.torch import load_file
    from test_distil import same_logits

    from pretrain import checkpoint as C

    run = tmp_path / "run"
    run_cli("pretrain", "train", "--config", "spanbert-tiny", "--set", f"data.path={train_data}", *COMMON,
            f"out_dir={run}", "train.steps=4", "train.eval_interval=4", "train.eval_steps=2")
    valid = read_jsonl(run / "valid.jsonl")[-1]
    assert {"valid_mlm_acc", "valid_mlm_unigram_acc", "valid_sbo_loss", "valid_sbo_acc",
            "valid_sbo_unigram_acc"} <= set(valid)
    state = C.load_full_model(C.resolve(str(run)))
    assert {"sbo.fc1.weight", "sbo.place.weight", "sbo.bias"} <= set(state)
    call_cli("checkpoints_tools", "to-hf", str(run), "--out", str(tmp_path / "hf"))
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert not any("sbo" in k or "pair" in k for k in load_file(tmp_path / "hf" / "model.safetensors"))
    hf = transformers.BertForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    same_logits(hf, run, {k: v for k, v in state.items() if not k.startswith("sbo.")})
