"""Parity with Hugging Face (litgpt style): random weights, same inputs, ptm vs transformers forward."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from pretrain import families
from pretrain import kernels as K
from pretrain import losses
from pretrain.models.config import ModelConfig
from pretrain.models.model import Pretraining
from pretrain.parallel import mcore

transformers = pytest.importorskip("transformers", reason="transformers not installed (scripts/setup.sh installs it)")
V, H, L, HEADS, S, B = 99, 32, 2, 4, 16, 3
PAD = 1  # RoBERTa's padding id (its positions start at PAD + 1)
E = 16  # ALBERT's factorised embedding width
MAX_DISTANCE = 5  # NEZHA's relative positions: clipped at +-5 of 16


def adapter(arch: str):
    """The family's Hugging Face adapter: its key maps both ways (HF -> ptm -> HF is bit-exact)."""
    return families.get(arch).adapter


@pytest.fixture(scope="module", autouse=True)
def one_process_group():
    mcore.initialize(tp=1, seed=0)


def _hf(arch, activation=None):
    torch.manual_seed(0)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=V, n_embd=H, n_layer=L, n_head=HEADS, n_positions=64,
                                      resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
        return transformers.GPT2LMHeadModel(cfg).eval()
    if arch == "gpt":  # OpenAI GPT (2018): post-LN, no embedding or final LayerNorm
        cfg = transformers.OpenAIGPTConfig(vocab_size=V, n_embd=H, n_layer=L, n_head=HEADS, n_positions=64,
                                           resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
        model = transformers.OpenAIGPTLMHeadModel(cfg)
        with torch.no_grad():  # random LayerNorm weights and biases, as the others' biases below
            for name, p in model.named_parameters():
                if ".ln_" in name or name.endswith("bias"):
                    p.normal_(mean=1.0 if name.endswith("weight") else 0.0, std=0.1)
        return model.eval()
    common = dict(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=HEADS, intermediate_size=48,
                  max_position_embeddings=64, hidden_dropout_prob=0, attention_probs_dropout_prob=0,
                  **({"hidden_act": activation} if activation else {}))
    if arch == "ernie":
        cfg = transformers.ErnieConfig(use_task_id=True, task_type_vocab_size=3, **common)
        model = transformers.ErnieForPreTraining(cfg)
    elif arch == "roberta":
        model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(type_vocab_size=1, pad_token_id=PAD, **common))
    elif arch == "albert":  # ALBERT's defaults: every layer shares one layer's weights, tanh GELU
        model = transformers.AlbertForPreTraining(transformers.AlbertConfig(embedding_size=E, **common))
    elif arch == "electra":  # the discriminator
        model = transformers.ElectraForPreTraining(transformers.ElectraConfig(embedding_size=H, **common))
    elif arch == "electra-generator":  # half as wide, on the discriminator's embedding width
        cfg = transformers.ElectraConfig(embedding_size=H, **dict(common, hidden_size=H // 2, num_attention_heads=HEADS // 2,
                                                                   intermediate_size=24))
        model = transformers.ElectraForMaskedLM(cfg)
    elif arch == "nezha":  # ptm's modeling file (transformers ships none); distances clipped well inside S
        from checkpoints_tools.nezha.configuration_nezha import NezhaConfig
        from checkpoints_tools.nezha.modeling_nezha import NezhaForPreTraining

        model = NezhaForPreTraining(NezhaConfig(max_relative_position=MAX_DISTANCE, **common))
    else:
        model = transformers.BertForPreTraining(transformers.BertConfig(**common))
    with torch.no_grad():  # HF zero-initialises biases; random ones make the test stronger
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(std=0.02)
    return model.eval()


def _ours(arch, hf_model, vocab_pad_to, activation=None):
    cfg = ModelConfig(arch=arch, vocab_size=V, vocab_pad_to=vocab_pad_to, hidden_size=H, num_layers=L, num_heads=HEADS,
                      ffn_hidden_size=H * 4 if arch in ("gpt2", "gpt") else 48, max_position_embeddings=64,
                      type_vocab_size={"gpt2": 0, "gpt": 0, "roberta": 1}.get(arch, 2),
                      task_type_vocab_size=3 if arch == "ernie" else 0,
                      layer_norm_eps=1e-5 if arch in ("gpt2", "gpt") else 1e-12, hidden_dropout=0, attention_dropout=0,
                      pad_token_id=PAD if arch == "roberta" else -1, embedding_size=E if arch == "albert" else 0,
                      max_relative_position=MAX_DISTANCE, activation=activation)
    model = Pretraining(cfg).eval()
    state, missing = adapter(arch).from_hf(hf_model.state_dict(), L, HEADS, model.embeddings.word.weight.shape[0],
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
@pytest.mark.parametrize("arch", ["bert", "ernie", "albert", "nezha"])
def test_bert_ernie_albert_and_nezha_match_hf(arch, vocab_pad_to):
    """ALBERT: embeddings of width E < H projected up, one layer's weights for both layers, tanh GELU, the MLM
    head's transform back to E, SOP on the nsp head. NEZHA: relative positions inside attention (against ptm's
    modeling file for transformers)."""
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


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_every_bert_layer_and_head_computes_the_models_activation(activation):
    """model.activation relu or tanh: the MLP's and the MLM head's transform, as BertForPreTraining's hidden_act."""
    hf = _hf("bert", activation)
    ours = _ours("bert", hf, 1, activation)
    ids, mask, types, _ = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask, types)["logits"], hf(ids, mask, types).prediction_logits, rtol=0,
                                   atol=1e-5)


@pytest.mark.parametrize("vocab_pad_to", [1, 128])
@pytest.mark.parametrize("arch", ["gpt2", "gpt"])
def test_gpt2_and_gpt_match_hf(arch, vocab_pad_to):
    """GPT-2 (pre-LN, a final LayerNorm) and GPT (post-LN, no embedding or final LayerNorm; random LayerNorm weights
    so that their places matter), the loss with HF's shifted labels too."""
    hf = _hf(arch)
    ours = _ours(arch, hf, vocab_pad_to)
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


@pytest.mark.parametrize("arch", ["bert", "gpt2", "gpt", "ernie", "roberta", "albert", "nezha"])
def test_hf_round_trip_is_bit_exact(arch):
    hf = _hf(arch)
    sd = hf.state_dict()
    ours, _ = adapter(arch).from_hf(sd, L, HEADS, 128, task_types=arch == "ernie")
    back = adapter(arch).to_hf(ours, L, HEADS, V)
    assert set(back) >= {k for k in sd if not k.endswith("attn.bias") and "position_ids" not in k}
    for k, v in back.items():
        assert torch.equal(v, sd[k]), k


def test_relative_attention_equals_a_float64_computation():
    """NEZHA's attention, ptm's and the modeling file's, against the paper's formulas evaluated element by element in
    float64 (the sinusoids to float32's precision, as both compute them): a_ij[2k] = sin(r / 10000^(2k/d)), a_ij[2k+1] = cos(...), r = clip(j - i, +-M) + M; scores
    q_i . (k_j + a_ij) / sqrt(d); outputs sum_j p_ij (v_j + a_ij); padding keys masked."""
    import math

    from checkpoints_tools.nezha.modeling_nezha import relative_position_encoding
    from megatron.core.transformer.spec_utils import build_module

    from pretrain.models.layers import Context, attention_spec, relative_positions

    s, d, m, heads = 7, 4, 2, 2
    a = torch.zeros(s, s, d, dtype=torch.float64)
    for i in range(s):
        for j in range(s):
            r = min(max(j - i, -m), m) + m
            for k in range(0, d, 2):
                a[i, j, k], a[i, j, k + 1] = math.sin(r / 10000 ** (k / d)), math.cos(r / 10000 ** (k / d))
    for ours in (relative_positions(s, d, m), relative_position_encoding(s, d, m)):
        torch.testing.assert_close(ours.double(), a, rtol=0, atol=1e-6)
    cfg = ModelConfig(arch="nezha", vocab_size=V, hidden_size=heads * d, num_heads=heads, max_relative_position=m,
                      attention_dropout=0)
    torch.manual_seed(0)
    ctx = Context.of(dataclasses.replace(cfg, init_std=0.5), mcore.tp_group())
    attention = build_module(attention_spec(cfg), ctx).double().eval()
    x = torch.randn(2, s, heads * d, dtype=torch.float64)
    keep = torch.ones(2, s, dtype=torch.bool)
    keep[1, 5:] = False
    with torch.no_grad():
        y, bias = attention(x, keep[:, None, None, :])
        qkv = (x @ attention.qkv.weight.T + attention.qkv.bias).view(2, s, heads, 3, d)
        out = torch.zeros(2, s, heads, d, dtype=torch.float64)
        for b in range(2):
            for h in range(heads):
                q, k, v = qkv[b, :, h, 0], qkv[b, :, h, 1], qkv[b, :, h, 2]
                for i in range(s):
                    scores = torch.tensor([float(q[i] @ (k[j] + a[i, j])) / math.sqrt(d) if keep[b, j] else -math.inf
                                           for j in range(s)], dtype=torch.float64)
                    p = torch.softmax(scores, 0)
                    out[b, i, h] = sum(p[j] * (v[j] + a[i, j]) for j in range(s))
        ref = out.reshape(2, s, heads * d) @ attention.out.weight.T
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-6)  # the sinusoid table is float32 (as NEZHA's), the rest fp64
    assert not torch.allclose(y, torch.zeros_like(y)) and bias.abs().sum() == 0  # zero-initialised output bias


def _electra(vocab_pad_to=1):
    """ElectraForPreTraining and ElectraForMaskedLM (half as wide) on one set of embedding tables, as ELECTRA trains
    them, and the ptm model holding both."""
    from pretrain.families.electra import join
    from pretrain.families.electra import generator_config

    disc, gen = _hf("electra"), _hf("electra-generator")
    gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
    cfg = ModelConfig(arch="electra", vocab_size=V, vocab_pad_to=vocab_pad_to, hidden_size=H, num_layers=L,
                      num_heads=HEADS, ffn_hidden_size=48, max_position_embeddings=64, hidden_dropout=0,
                      attention_dropout=0, generator_size=0.5)
    g = generator_config(cfg)
    assert (g.hidden_size, g.num_heads, g.ffn_hidden_size, g.embedding_size) == (H // 2, HEADS // 2, 24, H)
    model = Pretraining(cfg).eval()
    rows = model.embeddings.word.weight.shape[0]
    d, missing = adapter("electra").from_hf(disc.state_dict(), L, HEADS, rows)
    assert sorted({k.split(".")[0] for k in missing}) == ["embeddings", "mlm"]  # E = H: no projection; the
    # generator's head
    gs, missing = adapter("electra").from_hf(gen.state_dict(), L, HEADS // 2, rows)
    assert sorted({k.split(".")[0] for k in missing}) == ["rtd"]
    model.load_state_dict(join(d, gs))
    return disc, gen, model


@pytest.mark.parametrize("vocab_pad_to", [1, 128])
def test_electra_discriminator_and_generator_match_hf(vocab_pad_to):
    """The discriminator's per-token scores equal ElectraForPreTraining's, the generator's logits ElectraForMaskedLM's
    (padding present), and the ELECTRA objective equals HF's generator MLM loss + 50 x HF's discriminator loss on the
    input the generator's samples corrupted; HF -> ptm -> HF is bit-exact for both."""
    from pretrain.objectives.electra import Electra, sampler

    disc, gen, ours = _electra(vocab_pad_to)
    ids, mask, types, labels = _inputs()
    masked = labels != -100
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, mask, types)["rtd_logits"], disc(ids, mask, types).logits, rtol=0,
                                   atol=1e-5)
        logits = ours.generator(ids, mask, types)["logits"]
        torch.testing.assert_close(logits[..., :V], gen(ids, mask, types).logits, rtol=0, atol=1e-5)
        inputs = ids.masked_fill(masked, 3)  # the masked positions hold a [MASK] id
        terms = Electra().compute(ours, {"input_ids": inputs, "attention_mask": mask, "token_type_ids": types,
                                         "labels": labels})
        picked = ours.generator(inputs, mask, types, positions=masked)["logits"]
        corrupted = inputs.masked_scatter(masked, sampler(inputs, masked)(picked))
        replaced = (corrupted != ids).long()
        assert 0 < int(replaced[mask.bool()].sum()) <= int(masked.sum())  # samples differ from the original somewhere
        ref = gen(inputs, mask, types, labels=labels).loss + 50 * disc(corrupted, mask, types, labels=replaced).loss
    loss = losses.objective(terms, {name: t.count.double() for name, t in terms.items()})
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-5)
    for hf, heads in ((disc, HEADS), (gen, HEADS // 2)):
        sd = hf.state_dict()
        back = adapter("electra").to_hf(adapter("electra").from_hf(sd, L, heads, 128)[0], L, heads, V)
        assert set(back) == set(sd) - {"electra.embeddings.position_ids"}
        assert all(torch.equal(v, sd[k]) for k, v in back.items())


def test_gumbel_sampling_draws_from_the_softmax_whatever_the_layout():
    """argmax(logits + noise) samples each token with its softmax probability; a sample's noise depends on its tokens,
    not on its row in the batch, and a vocabulary slice's noise is that slice of the whole (TP)."""
    from pretrain.objectives.electra import gumbel_noise

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])
    n = 20000
    ids = torch.randint(0, 1000, (n, 8), generator=torch.Generator().manual_seed(0))
    positions = torch.zeros(n, 8, dtype=torch.bool)
    positions[:, 3] = True
    noise = gumbel_noise(ids, positions, torch.arange(5))
    freq = torch.bincount((logits + noise).argmax(-1), minlength=5) / n
    p = logits.softmax(-1)
    assert ((freq - p).abs() < 4 * (p * (1 - p) / n).sqrt()).all(), (freq, p)
    assert (logits + noise).argmax(-1).unique().numel() == 5  # a plain argmax would always pick token 0
    order = torch.randperm(n)
    torch.testing.assert_close(gumbel_noise(ids[order], positions[order], torch.arange(5)), noise[order], rtol=0, atol=0)
    torch.testing.assert_close(gumbel_noise(ids, positions, torch.arange(2, 5)), noise[:, 2:], rtol=0, atol=0)
    moved = torch.zeros_like(positions)
    moved[:, 4] = True  # another position of the same sample draws other noise
    assert not torch.equal(gumbel_noise(ids, moved, torch.arange(5)), noise)


def test_auc_pairs_count_ranked_pairs():
    from pretrain.objectives.electra import auc_pairs

    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 6, (300,), generator=g).float()  # many ties
    labels = torch.rand(300, generator=g) < 0.3
    pos, neg = scores[labels].double(), scores[~labels].double()
    pairs = (pos[:, None] > neg[None]).double() + 0.5 * (pos[:, None] == neg[None]).double()
    assert auc_pairs(scores, labels) == (float(pairs.sum()), float(pairs.numel()))


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


T5S = {"t5-1.0": (False, 20), "t5-1.1": (True, 20), "t5-1.0-past-max-distance": (False, 6)}  # (gated, max distance)
# 20: every distance of S = 16 inputs and 9 targets in a bucket of its own or a logarithmic one; 6: most of them at or
# past relative_max_distance, in the last bucket of their direction


def _t5(gated: bool, max_distance: int = 20):
    """A tiny HF T5 (1.0: ReLU, scaled tied logits; 1.1: gated GELU, unscaled, heads narrower than hidden / heads as
    in t5-v1_1-small) with random RMSNorm weights, 8 relative buckets over `max_distance`, and ptm's encoder-decoder
    holding its weights (float32: HF's T5LayerNorm computes in float32 whatever the input)."""
    from pretrain.models.seq2seq import EncoderDecoder

    torch.manual_seed(0)
    hf_cfg = transformers.T5Config(vocab_size=V, d_model=H, d_kv=12 if gated else H // HEADS, d_ff=48, num_layers=L, num_decoder_layers=3,
                                   num_heads=HEADS, relative_attention_num_buckets=8,
                                   relative_attention_max_distance=max_distance,
                                   dropout_rate=0.0, feed_forward_proj="gated-gelu" if gated else "relu",
                                   tie_word_embeddings=not gated, attn_implementation="eager")
    hf = transformers.T5ForConditionalGeneration(hf_cfg)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "layer_norm" in name:
                p.normal_(mean=1.0, std=0.1)
    from pretrain.families import get

    cfg = ModelConfig(**{**get("t5").adapter.model_config(hf.config), "vocab_pad_to": 128})
    ours = EncoderDecoder(cfg)
    state, missing = adapter("t5").from_hf(hf.state_dict(), L, HEADS, ours.embeddings.word.weight.shape[0])
    assert missing == []
    ours.load_state_dict(state)
    return hf.eval(), ours.eval(), cfg


@pytest.mark.parametrize("buckets, max_distance", [(32, 128), (8, 20), (8, 6)])
def test_t5_relative_buckets_are_hfs_at_and_past_the_max_distance(buckets, max_distance):
    """ptm's bucket of every key-minus-query distance from -2 to +2 x relative_max_distance is HF's
    (`T5Attention._relative_position_bucket`), split by direction (an encoder's) and looking back (a decoder's): the
    exact buckets, the logarithmic ones and, from relative_max_distance on, the last of each direction."""
    from transformers.models.t5.modeling_t5 import T5Attention

    from pretrain.models.layers import relative_bucket

    distance = torch.arange(-2 * max_distance, 2 * max_distance + 1)
    for bidirectional, last in ((True, {buckets // 2 - 1, buckets - 1}), (False, {buckets - 1})):
        theirs = T5Attention._relative_position_bucket(distance, bidirectional, buckets, max_distance)
        mine = relative_bucket(distance, bidirectional, buckets, max_distance)
        odd = mine != theirs
        assert torch.equal(mine, theirs), (bidirectional, distance[odd].tolist(), mine[odd].tolist(),
                                           theirs[odd].tolist())
        far = distance.abs() >= max_distance if bidirectional else distance <= -max_distance
        assert set(theirs[far].tolist()) == last  # the distances reach the clamp


@pytest.mark.parametrize("t5", T5S)
def test_t5_encoder_decoder_matches_hf(t5):
    """T5: RMSNorm, no biases, unscaled attention, the bucketed relative bias of each stack (bidirectional in the
    encoder, looking back in the decoder; distances within and past relative_max_distance), cross-attention, ReLU or
    gated-GELU MLPs, tied logits scaled (1.0) or not (1.1): `_matches_hf`."""
    hf, ours, cfg = _t5(*T5S[t5])
    _matches_hf(hf, ours, cfg, {"pad": 0, "eod": 1})


def _matches_hf(hf, ours, cfg, special: dict):
    """Encoder output, decoder output and logits within 1e-5 of the HF model's (logits: of their largest value, as
    T5 1.1's unscaled logits reach ~5 and float32 rounding grows with them), with a padded row in each stack; the
    loss on labels within 1e-6 (relative); HF -> ptm -> HF bit-exact, weights and config values."""
    from pretrain.families import get

    g = torch.Generator().manual_seed(1)
    ids, dec = torch.randint(3, V, (B, S), generator=g), torch.randint(3, V, (B, 9), generator=g)
    mask, dec_mask = torch.ones_like(ids), torch.ones_like(dec)
    mask[1, 10:], dec_mask[2, 6:] = 0, 0
    labels = torch.where(dec_mask.bool(), torch.randint(3, V, dec.shape, generator=g), -100)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, decoder_attention_mask=dec_mask,
                 labels=labels, output_hidden_states=True)
        hidden = ours(ids, mask, dec, dec_mask, hidden=True)
        logits = ours(ids, mask, dec, dec_mask)["logits"]
    torch.testing.assert_close(hidden["encoder_hidden"], ref.encoder_last_hidden_state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden["hidden"], ref.decoder_hidden_states[-1], rtol=1e-5, atol=1e-5)
    assert (logits[..., :V] - ref.logits).abs().max() <= 1e-5 * max(1.0, ref.logits.abs().max().item())
    assert (logits[..., V:] == torch.finfo(logits.dtype).min).all()  # the padding rows are never predicted
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    assert abs(loss.item() - ref.loss.item()) <= 1e-6 * max(1.0, ref.loss.item())  # T5 1.1's reaches 18
    back = adapter(cfg.arch).to_hf({k: v for k, v in ours.state_dict().items() if torch.is_tensor(v)}, L, HEADS, V)
    theirs = hf.state_dict()
    assert back.keys() == theirs.keys() and all(torch.equal(back[k], theirs[k]) for k in theirs)
    again = get(cfg.arch).adapter.hf_config(cfg, special)
    for key, value in hf.config.to_diff_dict().items():
        if key not in ("attn_implementation", "_attn_implementation_autoset", "transformers_version", "dtype",
                       "init_std"):
            assert getattr(again, key) == value, key


@pytest.mark.parametrize("preset", ["t5-small", "t5-base", "t5-v1_1-small", "t5-v1_1-base", "bart-base"])
def test_encoder_decoder_presets_count_as_many_parameters_as_hf_builds(preset):
    """pretrain/cost.py's count of an encoder-decoder (both stacks, cross-attention, T5's two bias tables, BART's two
    position tables and embedding LayerNorms, one word table) equals the HF class's on the meta device, the
    vocabulary unpadded (t5-small: 60,506,624, the published size)."""
    from pretrain import cost
    from pretrain.config import load
    from pretrain.families import get

    cfg = load(preset, ["model.vocab_pad_to=1"])
    adapter = get(cfg.model.arch).adapter
    with torch.device("meta"):
        hf = adapter.hf_model_class(adapter.hf_class)(adapter.hf_config(cfg.model, {"pad": 0, "eod": 1, "cls": 2}))
    assert cost.count_parameters(cfg.model) == sum(p.numel() for p in hf.parameters())
    if preset == "t5-small":
        assert cost.count_parameters(cfg.model) == 60_506_624


@pytest.mark.parametrize("t5", T5S)
def test_t5_greedy_decoding_with_a_kv_cache_gives_hfs_generate_tokens(t5):
    """ptm's decoding loop (the encoder once, the decoder a token at a time over cached self- and cross-attention keys
    and values, the bucketed bias at the token's position, within and past relative_max_distance) picks the tokens HF's `generate` picks (greedy, T5's start
    and end tokens), with a padded row; and each equals the argmax of a full forward pass over the prefix."""
    hf, ours, cfg = _t5(*T5S[t5])
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(2, V, (B, S), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mine, logits = ours.greedy(ids, mask, max_new_tokens=10, start=0, eos=1, pad=0, scores=True)
    # use_cache=False: transformers 5.23 sizes T5's decoder cache by the encoder's depth (3 decoder layers over 2 fail)
    theirs = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False, num_beams=1,
                         decoder_start_token_id=0, eos_token_id=1, pad_token_id=0, use_cache=False,
                         output_scores=True, return_dict_in_generate=True)
    assert torch.equal(mine, theirs.sequences), (mine, theirs.sequences)
    hf_logits = torch.stack(theirs.scores, 1)
    assert (logits - hf_logits).abs().max() <= 1e-5 * max(1.0, hf_logits.abs().max().item())
    with torch.no_grad():
        full = ours(ids, mask, mine[:, :-1])["logits"][..., :V].argmax(-1)
    live = torch.cat([torch.ones(B, 1, dtype=torch.bool), (mine[:, 1:-1] != 1).cummin(1).values], 1)  # before eos
    assert torch.equal(full[live], mine[:, 1:][live])
    assert len({tuple(r) for r in mine[:, 1:].tolist()}) > 1  # the rows decode differently: the test can tell


def test_bart_encoder_decoder_matches_hf():
    """BART: post-LN blocks with biases, a LayerNorm on each stack's embeddings, learned positions from row 2 in a
    table per stack, cross-attention, GELU, tied logits: `_matches_hf`."""
    from pretrain.families import get
    from pretrain.models.seq2seq import EncoderDecoder

    torch.manual_seed(0)
    hf_cfg = transformers.BartConfig(vocab_size=V, d_model=H, encoder_layers=L, decoder_layers=3,
                                     encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                                     encoder_ffn_dim=48, decoder_ffn_dim=48,
                                     max_position_embeddings=40, dropout=0.0, attention_dropout=0.0,
                                     activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                     decoder_start_token_id=2, forced_eos_token_id=2)
    hf = transformers.BartForConditionalGeneration(hf_cfg)
    with torch.no_grad():  # random biases and LayerNorms: HF zero-initialises them
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "layer_norm" in name or "layernorm" in name:
                p.normal_(mean=1.0 if name.endswith("weight") else 0.0, std=0.1)
    hf.eval()
    cfg = ModelConfig(**{**get("bart").adapter.model_config(hf.config), "vocab_pad_to": 128})
    ours = EncoderDecoder(cfg).eval()
    state, missing = adapter("bart").from_hf(hf.state_dict(), L, HEADS, ours.embeddings.word.weight.shape[0])
    assert missing == []
    ours.load_state_dict(state)
    _matches_hf(hf, ours, cfg, {"pad": 1, "cls": 0, "eod": 2})


def test_t5_starts_from_t5s_initialisation():
    """model.init=t5 (the t5 family's): every weight's standard deviation is that of HF's freshly built T5 (Mesh
    TensorFlow's scales: embeddings 1, queries (d * d_head)^-1/2 inside the fused QKV, keys and values d^-1/2, ...),
    within what two samples of that size allow; the default init draws all of them at init_std."""
    from pretrain.families import get
    from pretrain.models.seq2seq import EncoderDecoder

    torch.manual_seed(0)
    hf_cfg = transformers.T5Config(vocab_size=500, d_model=64, d_kv=12, d_ff=256, num_layers=2, num_heads=4,
                                   relative_attention_num_buckets=32, dropout_rate=0.0)
    theirs = transformers.T5ForConditionalGeneration(hf_cfg).state_dict()
    cfg = ModelConfig(**{**get("t5").adapter.model_config(hf_cfg), "vocab_pad_to": 1})
    assert cfg.init == "t5"
    for init in ("t5", "normal"):
        model = EncoderDecoder(dataclasses.replace(cfg, init=init))
        ours = adapter("t5").to_hf({k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}, 2, 4, 500)
        for name, ref in theirs.items():
            expected = ref.std().item() if init == "t5" else 0.02
            tolerance = 0.02 + 4 / ref.numel() ** 0.5  # two samples' standard deviations, each off by ~1/sqrt(2n)
            if "layer_norm" not in name:
                assert abs(ours[name].std().item() / expected - 1) < tolerance, (init, name, ours[name].std(), expected)
