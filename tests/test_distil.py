"""Distillation. DistilBERT: the soft targets against a float64 reference, over one rank's vocabulary and split over
two; a new student equal to every other teacher layer; training and the export as DistilBertForMaskedLM, which
transformers loads and whose logits are ptm's. TinyBERT, from a Hugging Face teacher: its two stages (what each trains
not left as it is), the layer-wise terms against a float64 reference computed from transformers' models, the export as
BertForMaskedLM / BertModel; a missing teacher named in one line, a teacher without an mlm head too."""
import numpy as np
import pytest
import torch

COMMON = ["data.seq_len=32", "model.max_position_embeddings=32", "train.global_batch_size=8", "train.micro_batch_size=4",
          "optimizer.warmup_steps=1", "train.eval_interval=0", "checkpoint.interval=0", "data.num_workers=0",
          "data.valid_fraction=0.02", "train.log_interval=1"]


def inputs(cfg):
    """Two rows of 16 token ids, the second padded from position 12."""
    ids = torch.randint(5, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    return ids, mask


def same_logits(hf, run, state):
    """ptm's model of `run` holding `state`, checked to compute transformers' model `hf`'s logits (within 1e-5);
    (the model, its config)."""
    from pretrain import checkpoint as C
    from pretrain import models
    from pretrain.parallel import mcore

    cfg = C.model_config(C.read_meta(C.resolve(str(run))))
    mcore.initialize(1, 0)
    ours = models.build(cfg).eval()
    ours.load_state_dict(state)
    ids, mask = inputs(cfg)
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids, attention_mask=mask).logits[mask.bool()],
                                   ours(ids, mask)["logits"][..., :cfg.vocab_size][mask.bool()], rtol=1e-5, atol=1e-5)
    return ours, cfg


def test_soft_targets_equal_a_float64_reference():
    """-sum softmax(t/T) log softmax(s/T) * T^2 per row, padding columns (masked to the dtype's minimum) counting
    nothing, within 1e-5 of float64 numpy; its gradient is softmax(s/T) - softmax(t/T), times T."""
    from pretrain.losses import soft_cross_entropy

    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(5, 12, generator=g) * 3, torch.randn(5, 12, generator=g) * 3
    s[:, 10:] = t[:, 10:] = torch.finfo(torch.float32).min  # two padding rows of the vocabulary
    s.requires_grad_(True)
    temperature = 2.0
    ours = soft_cross_entropy(s, t, temperature)

    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    a, b = s.detach().double().numpy()[:, :10] / temperature, t.double().numpy()[:, :10] / temperature
    ref = -(np.exp(log_softmax(b)) * log_softmax(a)).sum(-1) * temperature ** 2
    assert np.abs(ours.detach().numpy() - ref).max() < 1e-5
    ours.sum().backward()
    expected = (np.exp(log_softmax(a)) - np.exp(log_softmax(b))) * temperature
    assert np.abs(s.grad.numpy()[:, :10] - expected).max() < 1e-5 and s.grad[:, 10:].abs().max() == 0


def test_a_new_student_is_every_other_teacher_layer_and_trains(train_data, bert_teacher, tmp_path):
    """A student built for distillation holds, before any step, the teacher's embeddings (no token types), MLM head
    and layers 0 and 2 as its layers 0 and 1, bit for bit; its teacher is frozen and not in its checkpoints."""
    import json

    from pretrain import checkpoint as C
    from pretrain.config import load
    from pretrain.train import Trainer, train

    cfg = load("distilbert-tiny", [f"data.path={train_data}", f"distill.teacher={bert_teacher}", *COMMON,
                                   f"out_dir={tmp_path / 'student'}", "train.steps=3"])
    model = Trainer(cfg).model
    teacher = C.load_full_model(C.resolve(bert_teacher))
    ours = {k: v.detach() for k, v in model.named_parameters() if not k.startswith("teacher.")}
    assert "embeddings.token_type.weight" not in ours and "pooler.weight" not in ours
    for name, t in ours.items():
        source = name if not name.startswith("blocks.") else f"blocks.{2 * int(name.split('.')[1])}." + name.split(".", 2)[2]
        assert torch.equal(t, teacher[source]), name
    assert not any(p.requires_grad for p in model.teacher.parameters())
    train(cfg)
    rows = [json.loads(line) for line in open(tmp_path / "student" / "metrics.jsonl")]
    assert {"soft_loss", "mlm_loss", "cos_loss"} <= rows[0].keys()
    saved = C.load_full_model(C.resolve(str(tmp_path / "student")))
    assert saved.keys() == ours.keys()


def test_the_student_exports_as_distilbert_and_transformers_computes_its_logits(train_data, bert_teacher, tmp_path):
    """After training, `to-hf` writes a DistilBertForMaskedLM that transformers loads, with ptm's logits within 1e-5;
    `from-hf` brings every tensor back bit for bit."""
    import transformers
    from conftest import call_cli, run_cli

    from pretrain import checkpoint as C

    run = tmp_path / "student"
    proc = run_cli("pretrain", "train", "--config", "distilbert-tiny", "--set", f"data.path={train_data}",
                   f"distill.teacher={bert_teacher}", *COMMON, f"out_dir={run}", "train.steps=2")
    assert f"the student starts from distill.teacher={bert_teacher}: its embeddings, MLM head and layers 0, 2" in \
        proc.stderr
    call_cli("checkpoints_tools", "to-hf", str(run), "--out", str(tmp_path / "hf"))
    hf = transformers.DistilBertForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    state = C.load_full_model(C.resolve(str(run)))
    ours, cfg = same_logits(hf, run, state)
    call_cli("checkpoints_tools", "from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back"))
    back = C.load_full_model(str(tmp_path / "back"))
    vocab = cfg.vocab_size
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k][:vocab] if k in ("embeddings.word.weight", "mlm.bias") else back[k],
                           state[k][:vocab] if k in ("embeddings.word.weight", "mlm.bias") else state[k]) for k in state)


@pytest.fixture(scope="module")
def tinybert(train_data, bert_teacher, tmp_path_factory):
    """The test teacher exported to Hugging Face (BertForPreTraining), and a TinyBERT student (2 layers of 64, from its
    4 of 128) trained from that directory 1 step layer-wise and 1 on the prediction layer, then exported."""
    from conftest import call_cli, run_cli

    out = tmp_path_factory.mktemp("tinybert")
    call_cli("checkpoints_tools", "to-hf", bert_teacher, "--out", str(out / "teacher"))
    run_cli("pretrain", "train", "--config", "tinybert-tiny", "--set", f"data.path={train_data}",
            f"distill.teacher={out / 'teacher'}", *COMMON, f"out_dir={out / 'run'}", "train.steps=2",
            "distill.layer_steps=1")
    call_cli("checkpoints_tools", "to-hf", str(out / "run"), "--out", str(out / "student"))
    return out


def test_tinybert_distils_layers_then_the_prediction_layer_and_exports_as_bert(tinybert):
    """Step 1 trains the embedding, hidden-state and attention terms, step 2 the soft targets alone (the student's
    and the teacher's masked LM watched in both); the checkpoint holds the student and its projection, not the
    teacher; the export is a BertForMaskedLM whose logits are ptm's (within 1e-5), and BertModel reads it."""
    import json

    import transformers

    from pretrain import checkpoint as C

    rows = [json.loads(line) for line in open(tinybert / "run" / "metrics.jsonl")]
    assert {"embedding_loss", "hidden_loss", "attention_loss", "mlm_acc", "teacher_mlm_acc"} <= rows[0].keys()
    assert "soft_loss" not in rows[0] and rows[0]["loss"] == pytest.approx(
        rows[0]["embedding_loss"] + rows[0]["hidden_loss"] + rows[0]["attention_loss"], rel=1e-6)
    assert "hidden_loss" not in rows[1] and rows[1]["loss"] == pytest.approx(rows[1]["soft_loss"], rel=1e-6)
    assert [r["stage"] for r in rows] == [1, 2]
    ckpt = C.resolve(str(tinybert / "run"))
    state = C.load_full_model(ckpt)
    assert state["fit.weight"].shape == (128, 64) and not any(k.startswith("teacher.") for k in state)
    hf = transformers.BertForMaskedLM.from_pretrained(tinybert / "student").eval()
    assert hf.config.hidden_size == 64 and hf.config.num_hidden_layers == 2
    ours, cfg = same_logits(hf, tinybert / "run", {k: v for k, v in state.items() if not k.startswith("fit.")})
    ids, mask = inputs(cfg)
    base = transformers.BertModel.from_pretrained(tinybert / "student").eval()
    with torch.no_grad():
        torch.testing.assert_close(base(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()],
                                   ours.encode(ids, mask)[mask.bool()], rtol=1e-5, atol=1e-5)


def test_tinybert_leaves_what_a_stage_trains_not_as_it_is(train_data, bert_teacher, tmp_path):
    """The layer-wise stage trains not the MLM head, the prediction stage not the projection `fit` (only a watched
    term reaches them: zero gradients): the parameters `idle` names are those, left as they are (no weight decay),
    and the MLM head's first step is an Adam step of step count 1 (about lr where |g| >> eps), not of step 3."""
    import json

    from pretrain.config import load
    from pretrain.train import Trainer

    cfg = load("tinybert-tiny", [f"data.path={train_data}", f"distill.teacher={bert_teacher}", f"out_dir={tmp_path}",
                                 *COMMON, "train.steps=3", "distill.layer_steps=2"])
    trainer = Trainer(cfg)
    trained = {n: set() for n, p in trainer.model.named_parameters() if p.requires_grad}
    for n, p in trainer.model.named_parameters():
        if p.requires_grad:
            p.register_hook(lambda grad, n=n: trained[n].add(trainer.step) if grad.any() else None)
    weights = {}  # before each optimizer step
    trainer.optimizer.register_step_pre_hook(lambda *_: weights.setdefault(
        trainer.step, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}) and None)
    trainer.fit()
    for step in range(3):
        assert {n for n in trained if step not in trained[n]} == trainer.idle(step), step
    assert torch.equal(weights[2]["mlm.dense.weight"], weights[0]["mlm.dense.weight"])  # no decay while idle
    lr = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")][2]["lr"]
    first = (trainer.model.mlm.dense.bias.detach() - weights[2]["mlm.dense.bias"]).abs()
    assert first.median() > 0.99 * lr and first.max() <= lr * (1 + 1e-5), (first, lr)  # (at count 3: 0.64 lr)


def test_tinybert_layer_terms_equal_a_float64_reference_of_the_transformers_models(tinybert):
    """The layer-wise terms of ptm's student and teacher (float32) equal TinyBERT's losses computed in float64 from
    transformers' BertModels of both and the student's projection: the embeddings' and each mapped layer's hidden
    states (student layer m, teacher layer 2m) through the projection, and the attention scores q k^T / sqrt(d) of
    every head, recomputed from each layer's input with its query and key, as means over the real tokens and pairs;
    and the prediction layer's soft targets from the two models' masked-LM logits."""
    import functools

    import transformers

    from pretrain import checkpoint as C
    from pretrain import models, objectives
    from pretrain.config import load
    from pretrain.parallel import mcore

    cfg = load(str(tinybert / "run" / "config.yaml"))
    objective = objectives.get("tinybert").configured(cfg)
    mcore.initialize(1, 0)
    model = models.build(cfg.model, heads=functools.partial(objective.heads, cfg)).eval()
    state = C.load_full_model(C.resolve(str(tinybert / "run")))
    assert not model.load_state_dict(state, strict=False).unexpected_keys
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, cfg.model.vocab_size, (3, 20), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 13:], mask[2, 7:] = 0, 0
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids), "labels": labels}
    with torch.no_grad():
        terms = objective.compute(model, batch, objective.phase(0))
        soft = objective.compute(model, batch, objective.phase(cfg.distill.layer_steps))["soft"]

    def traced(directory):
        hf = transformers.BertModel.from_pretrained(directory).double().eval()
        with torch.no_grad():
            hidden = hf(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
            scores = []
            for layer, h in zip(hf.encoder.layer, hidden):
                heads = hf.config.num_attention_heads
                q, k = (f(h).view(*h.shape[:2], heads, -1).transpose(1, 2)
                        for f in (layer.attention.self.query, layer.attention.self.key))
                scores.append(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5)
        return hidden, scores

    (hs, ss), (ht, st) = traced(tinybert / "student"), traced(tinybert / "teacher")
    real = mask.bool()
    pairs = real[:, None, :, None] & real[:, None, None, :]
    w, b = state["fit.weight"].double(), state["fit.bias"].double()

    def mse(s, t):
        return ((s @ w.T + b - t) ** 2)[real].mean()

    expected = {"embedding": mse(hs[0], ht[0]), "hidden": mse(hs[1], ht[2]) + mse(hs[2], ht[4]),
                "attention": sum(((s - t) ** 2)[pairs.expand_as(s)].mean() for s, t in ((ss[0], st[1]), (ss[1], st[3])))}
    masked = labels != -100
    with torch.no_grad():
        s = transformers.BertForMaskedLM.from_pretrained(tinybert / "student").double()(ids, mask).logits[masked]
        t = transformers.BertForPreTraining.from_pretrained(tinybert / "teacher").double()(ids, mask).prediction_logits
    expected["soft"] = -(t[masked].softmax(-1) * s.log_softmax(-1)).sum(-1).mean()  # temperature 1
    terms["soft"] = soft
    got = {name: terms[name].loss.double() / terms[name].count.double() for name in expected}
    assert {n: int(terms[n].count) for n in expected} == {"embedding": 40, "hidden": 40,
                                                           "attention": 20 ** 2 + 13 ** 2 + 7 ** 2, "soft": 3}
    for name in expected:
        assert float(abs(got[name] - expected[name]) / expected[name]) < 1e-5, (name, got[name], expected[name])


def test_a_missing_teacher_is_named_in_one_line(train_data, tmp_path):
    from conftest import run_cli

    proc = run_cli("pretrain", "train", "--config", "tinybert-tiny", "--set", f"data.path={train_data}",
                   f"distill.teacher={tmp_path / 'nowhere'}", *COMMON, f"out_dir={tmp_path / 'run'}", "train.steps=1",
                   "distill.layer_steps=-1", check=False)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert f"distill.teacher={tmp_path / 'nowhere'} does not exist" in last and "Traceback" not in proc.stderr, last


@pytest.mark.parametrize("objective", ["distilbert-tiny", "tinybert-tiny"])
def test_a_teacher_without_an_mlm_head_is_one_line(objective, tmp_path):
    """A causal teacher (a GPT-2 directory, narrower and shallower than the student) is refused for what it is, in
    one line, not also for the widths and depths that follow from being another model."""
    transformers = pytest.importorskip("transformers")
    from pretrain.config import ConfigError, load

    transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000).save_pretrained(tmp_path)
    cfg = load(objective, [f"distill.teacher={tmp_path}", "data.path=none", "model.vocab_size=1000"])
    with pytest.raises(ConfigError) as e:
        cfg.validate()
    assert str(e.value) == (f"distill.teacher={tmp_path} is not a bidirectional model with an mlm head (heads ['lm']); "
                            "the soft targets need one: pass a BERT-family teacher")


def test_plan_counts_a_teacher_it_can_read_and_names_one_it_cannot(train_data, bert_teacher, tmp_path):
    """`ptm plan` shows the frozen teacher's parameters (those of the teacher the trainer builds) and its weights' row
    (bf16, split over 4 data-parallel ranks by ZeRO-3); a teacher that is not on this machine is named, not counted."""
    from conftest import run_cli

    from pretrain import plan
    from pretrain.config import load
    from pretrain.train import Trainer

    sets = [f"data.path={train_data}", "precision=bf16", "zero.stage=3", "distill.layer_steps=-1"]
    shown = run_cli("pretrain", "plan", "--config", "tinybert-tiny", "--gpus", "4", "--set", *sets,
                    f"distill.teacher={bert_teacher}").stdout
    trainer = Trainer(load("tinybert-tiny", [*sets[:1], *COMMON, f"distill.teacher={bert_teacher}",
                                             f"out_dir={tmp_path / 'run'}", "train.steps=1", "distill.layer_steps=-1"]))
    n = sum(p.numel() for p in trainer.model.teacher.parameters())
    trainer.close()
    assert f"teacher: {n / 1e6:.1f}M parameters per TP rank, frozen" in shown
    assert any(line.startswith("frozen teacher") for line in shown.splitlines())
    cfg = load("tinybert-tiny", [*sets, f"distill.teacher={bert_teacher}"])
    plan.resolve_vocab(cfg, None)  # the dataset's, as `ptm plan` reads it
    assert plan.estimate(cfg, 4).teacher == 2 * n // 4
    missing = run_cli("pretrain", "plan", "--config", "tinybert-tiny", "--set", *sets,
                      f"distill.teacher={tmp_path / 'nowhere'}").stdout
    assert f"distill.teacher={tmp_path / 'nowhere'} is not here: its weights are not counted" in missing
    assert "frozen teacher" not in missing
