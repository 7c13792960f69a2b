"""Parity with Hugging Face (litgpt style): random weights, same inputs, ptm vs transformers forward."""

import pytest
import torch
import torch.nn.functional as F

from checkpoints_tools import hf_keys
from pretrain import kernels as K
from pretrain.models.config import ModelConfig
from pretrain.models.model import Pretraining
from pretrain.parallel import mcore

transformers = pytest.importorskip("transformers", reason="transformers not installed (scripts/setup.sh installs it)")
V, H, L, HEADS, S, B = 99, 32, 2, 4, 16, 3


@pytest.fixture(scope="module", autouse=True)
def one_process_group():
    mcore.initialize(tp=1, seed=0)


def _hf(arch):
    torch.manual_seed(0)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=V, n_embd=H, n_layer=L, n_head=HEADS, n_positions=64,
                                      resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
        return transformers.GPT2LMHeadModel(cfg).eval()
    common = dict(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=HEADS, intermediate_size=48,
                  max_position_embeddings=64, hidden_dropout_prob=0, attention_probs_dropout_prob=0)
    if arch == "ernie":
        cfg = transformers.ErnieConfig(use_task_id=True, task_type_vocab_size=3, **common)
        model = transformers.ErnieForPreTraining(cfg)
    else:
        model = transformers.BertForPreTraining(transformers.BertConfig(**common))
    with torch.no_grad():  # HF zero-initialises biases; random ones make the test stronger
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(std=0.02)
    return model.eval()


def _ours(arch, hf_model, vocab_pad_to):
    cfg = ModelConfig(arch=arch, vocab_size=V, vocab_pad_to=vocab_pad_to, hidden_size=H, num_layers=L, num_heads=HEADS,
                      ffn_hidden_size=H * 4 if arch == "gpt2" else 48, max_position_embeddings=64,
                      type_vocab_size=0 if arch == "gpt2" else 2, task_type_vocab_size=3 if arch == "ernie" else 0,
                      layer_norm_eps=1e-5 if arch == "gpt2" else 1e-12, hidden_dropout=0, attention_dropout=0)
    model = Pretraining(cfg).eval()
    state, missing = hf_keys.from_hf(arch, hf_model.state_dict(), L, HEADS, model.embeddings.word.weight.shape[0],
                                     task_types=arch == "ernie")
    assert missing == []
    model.load_state_dict(state)
    return model


def _inputs():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (B, S), generator=g)
    mask = torch.ones(B, S, dtype=torch.long)
    mask[1, 11:] = 0
    types = torch.zeros(B, S, dtype=torch.long)
    types[:, 7:] = 1
    labels = torch.full((B, S), -100)
    labels[:, 3:9:2] = ids[:, 3:9:2]
    return ids, mask, types, labels


@pytest.mark.parametrize("vocab_pad_to", [1, 128])
@pytest.mark.parametrize("arch", ["bert", "ernie"])
def test_bert_and_ernie_match_hf(arch, vocab_pad_to):
    hf = _hf(arch)
    ours = _ours(arch, hf, vocab_pad_to)
    ids, mask, types, labels = _inputs()
    nsp = torch.tensor([0, 1, 0])
    extra = {"task_type_ids": torch.full_like(ids, 2)} if arch == "ernie" else {}
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels, next_sentence_label=nsp,
                 **extra)
        out = ours(ids, mask, types, extra.get("task_type_ids"))
    assert out["logits"].shape[-1] == (V if vocab_pad_to == 1 else 128)
    torch.testing.assert_close(out["logits"][..., :V], ref.prediction_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(out["nsp_logits"], ref.seq_relationship_logits, rtol=0, atol=1e-5)
    mlm = K.cross_entropy(out["logits"].clone(), labels).sum() / (labels != -100).sum()
    loss = mlm + F.cross_entropy(out["nsp_logits"], nsp)
    torch.testing.assert_close(loss, ref.loss, rtol=1e-6, atol=1e-6)
    # the MLM head on the masked positions only gives the same logits
    with torch.no_grad():
        picked = ours(ids, mask, types, extra.get("task_type_ids"), positions=labels != -100)["logits"]
    torch.testing.assert_close(picked, out["logits"][labels != -100], rtol=0, atol=1e-6)


@pytest.mark.parametrize("vocab_pad_to", [1, 128])
def test_gpt2_matches_hf(vocab_pad_to):
    hf = _hf("gpt2")
    ours = _ours("gpt2", hf, vocab_pad_to)
    ids = _inputs()[0]
    with torch.no_grad():
        ref = hf(input_ids=ids, labels=ids)
        out = ours(ids)
    torch.testing.assert_close(out["logits"][..., :V], ref.logits, rtol=0, atol=1e-5)
    loss = K.cross_entropy(out["logits"][:, :-1].clone(), ids[:, 1:]).mean()
    torch.testing.assert_close(loss, ref.loss, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("arch", ["bert", "gpt2", "ernie"])
def test_hf_round_trip_is_bit_exact(arch):
    hf = _hf(arch)
    sd = hf.state_dict()
    ours, _ = hf_keys.from_hf(arch, sd, L, HEADS, 128, task_types=arch == "ernie")
    back = hf_keys.to_hf(arch, ours, L, HEADS, V)
    assert set(back) >= {k for k in sd if not k.endswith("attn.bias") and "position_ids" not in k}
    for k, v in back.items():
        assert torch.equal(v, sd[k]), k
