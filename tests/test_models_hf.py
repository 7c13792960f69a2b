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
PAD = 1  # RoBERTa's padding id (its positions start at PAD + 1)
E = 16  # ALBERT's factorised embedding width


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
    elif arch == "roberta":
        model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(type_vocab_size=1, pad_token_id=PAD, **common))
    elif arch == "albert":  # ALBERT's defaults: every layer shares one layer's weights, tanh GELU
        model = transformers.AlbertForPreTraining(transformers.AlbertConfig(embedding_size=E, **common))
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
                      type_vocab_size={"gpt2": 0, "roberta": 1}.get(arch, 2), task_type_vocab_size=3 if arch == "ernie" else 0,
                      layer_norm_eps=1e-5 if arch == "gpt2" else 1e-12, hidden_dropout=0, attention_dropout=0,
                      pad_token_id=PAD if arch == "roberta" else -1, embedding_size=E if arch == "albert" else 0)
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
@pytest.mark.parametrize("arch", ["bert", "ernie", "albert"])
def test_bert_ernie_and_albert_match_hf(arch, vocab_pad_to):
    """ALBERT: embeddings of width E < H projected up, one layer's weights for both layers, tanh GELU, the MLM
    head's transform back to E, SOP on the nsp head."""
    hf = _hf(arch)
    ours = _ours(arch, hf, vocab_pad_to)
    ids, mask, types, labels = _inputs()
    nsp = torch.tensor([0, 1, 0])
    extra = {"task_type_ids": torch.full_like(ids, 2)} if arch == "ernie" else {}
    with torch.no_grad():
        pair = {"sentence_order_label" if arch == "albert" else "next_sentence_label": nsp}
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels, **pair, **extra)
        out = ours(ids, mask, types, extra.get("task_type_ids"))
    assert out["logits"].shape[-1] == (V if vocab_pad_to == 1 else 128)
    torch.testing.assert_close(out["logits"][..., :V], ref.prediction_logits, rtol=0, atol=1e-5)
    sop = ref.sop_logits if arch == "albert" else ref.seq_relationship_logits
    torch.testing.assert_close(out["nsp_logits"], sop, rtol=0, atol=1e-5)
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


@pytest.mark.parametrize("vocab_pad_to", [1, 128])
def test_roberta_matches_hf_with_its_positions(vocab_pad_to):
    """RobertaForMaskedLM numbers positions from the padding id + 1 and puts padding at the padding id: the logits
    agree at every position, padding included (the rows' positions differ once a row is padded)."""
    hf = _hf("roberta")
    ours = _ours("roberta", hf, vocab_pad_to)
    ids, mask, _, labels = _inputs()
    ids = torch.where(mask.bool(), torch.where(ids == PAD, PAD + 1, ids), PAD)  # padding only where the mask says
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, labels=labels)
        out = ours(ids, mask)
    assert "nsp_logits" not in out and not hasattr(ours, "pooler")
    torch.testing.assert_close(out["logits"][..., :V], ref.logits, rtol=0, atol=1e-5)
    mlm = K.cross_entropy(out["logits"].clone(), labels).sum() / (labels != -100).sum()
    torch.testing.assert_close(mlm, ref.loss, rtol=1e-6, atol=1e-6)
    ours.embeddings.pad = None  # with BERT's positions (from 0) every row differs: the test can tell
    with torch.no_grad():
        plain = ours(ids, mask)["logits"][..., :V]
    assert (plain - ref.logits).abs().amax(dim=(1, 2)).gt(1e-3).tolist() == [True, True, True]


@pytest.mark.parametrize("arch", ["bert", "gpt2", "ernie", "roberta", "albert"])
def test_hf_round_trip_is_bit_exact(arch):
    hf = _hf(arch)
    sd = hf.state_dict()
    ours, _ = hf_keys.from_hf(arch, sd, L, HEADS, 128, task_types=arch == "ernie")
    back = hf_keys.to_hf(arch, ours, L, HEADS, V)
    assert set(back) >= {k for k in sd if not k.endswith("attn.bias") and "position_ids" not in k}
    for k, v in back.items():
        assert torch.equal(v, sd[k]), k


@pytest.mark.parametrize("share", ["all", "attention", "ffn"])
def test_shared_layers_equal_an_unshared_model_holding_copies(share):
    """share_layers: the shared parameters exist once, every layer runs them (the same outputs as a model whose
    layers hold copies), and their gradient is the sum of what each layer's copy would get."""
    import dataclasses

    cfg = ModelConfig(arch="bert", vocab_size=V, hidden_size=H, num_layers=3, num_heads=HEADS, ffn_hidden_size=48,
                      max_position_embeddings=64, hidden_dropout=0, attention_dropout=0, share_layers=share)
    torch.manual_seed(0)
    shared = Pretraining(cfg)
    plain = Pretraining(dataclasses.replace(cfg, share_layers="none"))
    sub = {"attention": "attn.", "ffn": "mlp."}.get(share)

    def source(key):  # the shared model's parameter that plain's `key` copies
        if not key.startswith("blocks."):
            return key
        _, i, rest = key.split(".", 2)
        return f"blocks.0.{rest}" if share == "all" else "shared." + rest[len(sub):] if rest.startswith(sub) else key

    state = shared.state_dict()
    plain.load_state_dict({k: state[source(k)] for k in plain.state_dict()})
    unique = sum(p.numel() for p in shared.parameters())
    assert unique < sum(p.numel() for p in plain.parameters())
    ids, mask, types, labels = _inputs()
    outs = [m(ids, mask, types)["logits"] for m in (shared, plain)]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    for out in outs:
        K.cross_entropy(out.clone(), labels).sum().backward()
    summed = {}
    for k, p in plain.named_parameters():
        if p.grad is not None:  # the pooler and NSP head get none from masked LM alone
            summed[source(k)] = summed.get(source(k), 0) + p.grad
    assert {k for k, p in shared.named_parameters() if p.grad is not None} == set(summed)
    for k, p in shared.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(p.grad, summed[k], rtol=1e-5, atol=1e-6, msg=k)
