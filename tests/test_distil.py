"""Distillation (DistilBERT): the soft targets against a float64 reference, over one rank's vocabulary and split over
two; a new student equal to every other teacher layer; training and the export as DistilBertForMaskedLM, which
transformers loads and whose logits are ptm's."""
import numpy as np
import pytest
import torch

COMMON = ["data.seq_len=32", "model.max_position_embeddings=32", "train.global_batch_size=8", "train.micro_batch_size=4",
          "optimizer.warmup_steps=1", "train.eval_interval=0", "checkpoint.interval=0", "data.num_workers=0",
          "data.valid_fraction=0.02", "train.log_interval=1"]


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
    from conftest import run_cli

    from pretrain import checkpoint as C
    from pretrain import models
    from pretrain.parallel import mcore

    run = tmp_path / "student"
    run_cli("pretrain", "train", "--config", "distilbert-tiny", "--set", f"data.path={train_data}",
            f"distill.teacher={bert_teacher}", *COMMON, f"out_dir={run}", "train.steps=2")
    run_cli("checkpoints_tools", "to-hf", str(run), "--out", str(tmp_path / "hf"))
    hf = transformers.DistilBertForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    ckpt = C.resolve(str(run))
    cfg = C.model_config(C.read_meta(ckpt))
    mcore.initialize(1, 0)
    ours = models.build(cfg).eval()
    state = C.load_full_model(ckpt)
    ours.load_state_dict(state)
    ids = torch.randint(5, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=ids, attention_mask=mask).logits[mask.bool()],
                                   ours(ids, mask)["logits"][..., :cfg.vocab_size][mask.bool()], rtol=1e-5, atol=1e-5)
    run_cli("checkpoints_tools", "from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "back"))
    back = C.load_full_model(str(tmp_path / "back"))
    vocab = cfg.vocab_size
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k][:vocab] if k in ("embeddings.word.weight", "mlm.bias") else back[k],
                           state[k][:vocab] if k in ("embeddings.word.weight", "mlm.bias") else state[k]) for k in state)
