"""XLNet and Transformer-XL (pretrain/models/two_stream.py) against Hugging Face's XLNetLMHeadModel on random weights:
both streams with XLNet's permutation mask and target positions, relative segments, a padded row, the memory of a
previous call, the causal (attn_type uni) variant, the loss on labels, and HF -> ptm -> HF bit for bit."""
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pretrain.families import get
from pretrain.models.config import ModelConfig
from pretrain.models.two_stream import XLNet
from pretrain.parallel import mcore

transformers = pytest.importorskip("transformers")
V, H, L, HEADS, S, B, MEM = 99, 32, 2, 4, 12, 3, 7


def _xlnet(causal: bool, reuse_len: int | None = None):
    """A tiny HF XLNet (memory of 7, random LayerNorm weights and biases) and ptm's XLNet holding its weights."""
    mcore.initialize(1, 0)
    torch.manual_seed(0)
    hf_cfg = transformers.XLNetConfig(vocab_size=V, d_model=H, n_layer=L, n_head=HEADS, d_inner=48, dropout=0.0,
                                      mem_len=MEM, reuse_len=reuse_len, attn_type="uni" if causal else "bi")
    hf = transformers.XLNetLMHeadModel(hf_cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "layer_norm" in name or name.endswith("bias"):
                p.normal_(mean=1.0 if name.endswith("layer_norm.weight") else 0.0, std=0.1)
    adapter = get("xlnet").adapter
    cfg = ModelConfig(**{**adapter.model_config(hf.config), "vocab_pad_to": 128})
    ours = XLNet(cfg).eval()
    state, missing = adapter.from_hf(hf.state_dict(), L, HEADS, ours.embeddings.word.weight.shape[0])
    assert missing == []
    ours.load_state_dict(state, strict=False)  # megatron's _extra_state entries aside
    assert {k for k in ours.state_dict() if not k.endswith("_extra_state")} == set(state)
    return hf, ours, cfg


def _close(ours, theirs):
    assert (ours[..., :V] - theirs).abs().max() <= 1e-5 * max(1.0, theirs.abs().max().item())


def test_xlnet_two_streams_segments_padding_and_memory_match_hf():
    """The content stream alone (relative segments, a padded row); both streams under a permutation mask with the
    query stream at target positions (HF's one-hot target_mapping); then a second segment attending to the first's
    memory, with and without a permutation: logits within 1e-5, the memory HF returns equal; and the loss on labels
    at the target positions within 1e-6 of HF's."""
    hf, ours, cfg = _xlnet(causal=False)
    g = torch.Generator().manual_seed(1)
    ids, segments = torch.randint(0, V, (B, S), generator=g), torch.randint(0, 2, (B, S), generator=g)
    mask = torch.ones(B, S)
    mask[1, 9:] = 0
    perm = torch.rand(B, S, S, generator=g) < 0.5
    targets = torch.stack([torch.randperm(S, generator=g)[:4] for _ in range(B)])
    labels = torch.randint(0, V, targets.shape, generator=g)
    more, more_segments = torch.randint(0, V, (B, 5), generator=g), torch.randint(0, 2, (B, 5), generator=g)
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask, token_type_ids=segments, use_mems=True)
        mine = ours(ids, mask, segments)
        _close(mine["logits"], ref.logits)
        assert len(mine["memory"]) == L
        for theirs, kept in zip(ref.mems, mine["memory"]):  # each layer's input, the last MEM positions
            torch.testing.assert_close(kept, theirs.transpose(0, 1)[:, -MEM:], rtol=1e-5, atol=1e-5)
        ref2 = hf(ids, attention_mask=mask, token_type_ids=segments, perm_mask=perm.float(),
                  target_mapping=F.one_hot(targets, S).float(), labels=labels)
        mine2 = ours(ids, mask, segments, perm_mask=perm, targets=targets)
        _close(mine2["logits"], ref2.logits)
        loss = F.cross_entropy(mine2["logits"].flatten(0, 1), labels.flatten())
        assert abs(loss.item() - ref2.loss.item()) <= 1e-6 * max(1.0, ref2.loss.item())
        ref3 = hf(more, token_type_ids=more_segments, mems=ref.mems, use_mems=True)
        _close(ours(more, None, more_segments, memory=mine["memory"])["logits"], ref3.logits)
        few = targets[:, :2] % 5
        ref4 = hf(more, token_type_ids=more_segments, mems=ref.mems, perm_mask=perm[:, :5, :5].float(),
                  target_mapping=F.one_hot(few, 5).float())
        _close(ours(more, None, more_segments, perm_mask=perm[:, :5, :5], targets=few, memory=mine["memory"])["logits"],
               ref4.logits)


def test_transformer_xl_style_causal_xlnet_with_memory_matches_hf():
    """model.causal (HF attn_type uni): each token sees the memory and the tokens before it; with and without a
    previous segment's memory. (HF's uni attention breaks on a padding or permutation mask: not compared.)"""
    hf, ours, cfg = _xlnet(causal=True)
    assert cfg.causal
    g = torch.Generator().manual_seed(2)
    ids, more = torch.randint(0, V, (B, S), generator=g), torch.randint(0, V, (B, 5), generator=g)
    with torch.no_grad():
        ref = hf(ids, use_mems=True)
        mine = ours(ids)
        _close(mine["logits"], ref.logits)
        _close(ours(more, memory=mine["memory"])["logits"], hf(more, mems=ref.mems).logits)


def test_a_fixed_size_memory_filling_up_with_reuse_len_matches_hf():
    """Training carries a memory of mem_len slots and a mask of those that hold a state (a stream's first segments
    fill it up), and keeps only each segment's first reuse_len positions (XLNet's reuse): an empty memory is no
    memory; over a partly filled one, then a full one, the logits and the memory are HF's with its mems and
    reuse_len (cache_mem)."""
    reuse = 5
    hf, ours, cfg = _xlnet(causal=False, reuse_len=reuse)
    assert cfg.reuse_len == reuse
    g = torch.Generator().manual_seed(3)
    segments = [torch.randint(0, V, (B, n), generator=g) for n in (S, 5, S)]
    mems, memory, mask = None, None, torch.zeros(B, MEM, dtype=torch.bool)
    with torch.no_grad():
        for i, ids in enumerate(segments):
            ref = hf(ids, mems=mems, use_mems=True)
            mine = ours(ids, memory=memory, memory_mask=mask)
            _close(mine["logits"], ref.logits)
            mems, memory, mask = ref.mems, mine["memory"], mine["memory_mask"]
            filled = min(MEM, reuse * (i + 1))  # 5, then 5 + 5 of 7, then full
            assert mask.sum(1).tolist() == [filled] * B and mask[:, MEM - filled:].all()
            for theirs, kept in zip(mems, memory):
                torch.testing.assert_close(kept[:, MEM - filled:], theirs.transpose(0, 1), rtol=1e-5, atol=1e-5)


def test_gradients_over_a_memory_and_both_streams_are_hfs():
    """One training step's gradients (both streams under a permutation mask, segments, a memory of the previous
    segment kept with reuse_len, the tied LM head) equal XLNetLMHeadModel's with the same mems, every weight within
    1e-5 of its largest gradient: what training does with the memory is XLNet's."""
    hf, ours, cfg = _xlnet(causal=False, reuse_len=5)
    g = torch.Generator().manual_seed(5)
    first, ids = torch.randint(0, V, (B, S), generator=g), torch.randint(0, V, (B, S), generator=g)
    segments, perm = torch.randint(0, 2, (B, S), generator=g), torch.rand(B, S, S, generator=g) < 0.5
    targets = torch.stack([torch.randperm(S, generator=g)[:4] for _ in range(B)])
    labels = torch.randint(0, V, targets.shape, generator=g)
    with torch.no_grad():
        mems, mine = hf(first, use_mems=True).mems, ours(first, memory_mask=torch.zeros(B, MEM, dtype=torch.bool))
    hf(ids, token_type_ids=segments, perm_mask=perm.float(), target_mapping=F.one_hot(targets, S).float(),
       labels=labels, mems=mems).loss.backward()
    logits = ours(ids, None, segments, perm_mask=perm, targets=targets, memory=mine["memory"],
                  memory_mask=mine["memory_mask"])["logits"]
    F.cross_entropy(logits[..., :V].flatten(0, 1), labels.flatten()).backward()
    grads = get("xlnet").adapter.to_hf({n: p.grad for n, p in ours.named_parameters()}, L, HEADS, V)
    for name, p in hf.named_parameters():
        assert (grads[name] - p.grad).abs().max() <= 1e-5 * p.grad.abs().max(), name


def test_the_query_stream_adds_no_kernels_per_layer():
    """Both streams run through each layer as one sequence of queries: the query stream costs a few ops per model
    (its start, its masks) and two per layer (joining and splitting the streams) in a training step, not a second
    pass of every layer's kernels (a GPU's step is bound by its launches: docs/performance.md)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += 1
            return func(*args, **(kwargs or {}))

    def ops(layers: int, query_stream: bool) -> int:
        mcore.initialize(1, 0)
        cfg = ModelConfig(**{**get("xlnet").adapter.model_config(transformers.XLNetConfig(
            vocab_size=V, d_model=H, n_layer=layers, n_head=HEADS, d_inner=48)), "vocab_pad_to": 128})
        model, g = XLNet(cfg).train(), torch.Generator().manual_seed(0)
        ids, perm = torch.randint(0, V, (B, S), generator=g), torch.rand(B, S, S, generator=g) < 0.5
        targets = torch.stack([torch.randperm(S, generator=g)[:4] for _ in range(B)]) if query_stream else None
        with Ops() as counted:
            model(ids, None, torch.zeros_like(ids), perm_mask=perm, targets=targets)["logits"].float().sum().backward()
        return counted.count
    per_layer = [(ops(layers, True) - ops(layers, False)) for layers in (2, 4)]
    assert (per_layer[1] - per_layer[0]) / 2 <= 8, per_layer  # 7: joining, splitting and their gradients (223 when
    # the query stream ran each layer on its own)


@pytest.mark.parametrize("causal", [False, True], ids=["xlnet", "transformer-xl"])
def test_xlnet_round_trip_is_bit_exact_with_its_config(causal):
    """HF -> ptm -> HF: every weight bit for bit (the [hidden, heads, head_dim] projections, the tied LM head), and
    the config HF would write again; XLNetModel's weights import with only the LM head's bias missing."""
    hf, ours, cfg = _xlnet(causal)
    adapter = get("xlnet").adapter
    back = adapter.to_hf({k: v for k, v in ours.state_dict().items() if torch.is_tensor(v)}, L, HEADS, V)
    theirs = hf.state_dict()
    assert back.keys() == theirs.keys() and all(torch.equal(back[k], theirs[k]) for k in theirs)
    again = adapter.hf_config(cfg, {"pad": 5, "cls": 1, "sep": 2})
    for key, value in hf.config.to_diff_dict().items():
        if key not in ("attn_implementation", "_attn_implementation_autoset", "transformers_version", "dtype"):
            assert getattr(again, key) == value, key
    base = {k[len("transformer."):]: v for k, v in theirs.items() if k.startswith("transformer.")}
    state, missing = adapter.from_hf(base, L, HEADS, 128)
    assert missing == ["lm_bias"] and all(torch.equal(state[k], v) for k, v in
                                          adapter.from_hf(theirs, L, HEADS, 128)[0].items() if k != "lm_bias")


@pytest.mark.parametrize("tp", [1, 2])
def test_the_cost_module_counts_xlnet_as_built_and_as_hf_does(tp):
    """pretrain/cost.py's count (q, kv, r and the output without biases, u, v, s and the segment vectors per head, the
    query stream's start, the LM head's bias) equals the model's on one rank of `tp` (split: what megatron marks) and,
    the vocabulary unpadded, XLNetLMHeadModel's on the meta device."""
    from pretrain import cost

    class Rank:  # one rank of a TP group of `tp` (the model is built on the meta device: no communication)
        def size(self):
            return tp

        def rank(self):
            return 0

    hf, _, cfg = _xlnet(causal=False)
    with torch.device("meta"):
        model = XLNet(cfg, tp=Rank() if tp > 1 else mcore.OneRank())
    assert cost.count_parameters(cfg, tp=tp) == sum(p.numel() for p in model.parameters())
    assert cost.count_parameters(ModelConfig(**{**vars(cfg), "vocab_pad_to": 1})) == sum(
        p.numel() for p in hf.parameters())


# ---- the permutation objective's draws (pretrain/data/permutation.py) --------------------------------------------------

def _xlnet_local_perm(is_masked, functional, index):
    """The released code's `_local_perm` (TensorFlow), line for line in numpy, given its shuffled `index`."""
    non_func = ~functional
    non_mask = ~is_masked & non_func
    masked_or_func = ~non_mask
    rev_index = np.where(non_mask, -1, index)
    target_tokens = masked_or_func & non_func
    self_rev_index = np.where(target_tokens, rev_index, rev_index + 1)
    return (self_rev_index[:, None] <= rev_index[None, :]) & masked_or_func


def test_the_factorisation_is_xlnets_local_permutation():
    """perm_mask equals the released `_local_perm`'s for the same order (random predicted and functional tokens,
    two blocks of perm_size); in it every unpredicted token is seen by all, a target sees exactly the targets ranked
    before it, and the order is one permutation of perm_size applied to each block."""
    from pretrain.data import permutation

    rng = np.random.default_rng(0)
    for _ in range(20):
        s, perm_size = 16, 8
        is_masked, functional = rng.random(s) < 0.3, rng.random(s) < 0.1
        order = permutation.local_order(s, perm_size, rng)
        assert sorted(order) == list(range(s)) and (order[8:] - order[:8] == 8).all()
        targets = is_masked & ~functional
        perm = permutation.factorisation(targets, functional, order)
        assert (perm == _xlnet_local_perm(is_masked, functional, order)).all()
        plain = ~is_masked & ~functional
        assert not perm[:, plain].any()
        for i in np.flatnonzero(targets):
            seen = np.flatnonzero(~perm[i] & targets)
            assert set(seen) == {j for j in np.flatnonzero(targets) if order[j] < order[i]}


def test_span_mask_predicts_the_goal_in_whole_word_ngrams():
    """Exactly `goal` tokens (85 of 512, as XLNet's num_predict), a function of the generator alone; with words of
    two tokens, nearly all of them in runs of whole words (the rest single tokens that top up the goal); a goal of
    every token is met."""
    from pretrain.data import permutation

    word_start = np.tile([1, 0], 256).astype(np.uint8)
    whole = total = 0
    for seed in range(10):
        mask = permutation.span_mask(word_start, 85, np.random.default_rng(seed))
        assert mask.sum() == 85 and (mask == permutation.span_mask(word_start, 85, np.random.default_rng(seed))).all()
        edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
        for begin, end in zip(edges[::2], edges[1::2]):
            total += end - begin
            whole += (end - begin) * (word_start[begin] == 1 and (end == len(mask) or word_start[end] == 1))
    assert whole / total > 0.8
    assert permutation.span_mask(word_start, 512, np.random.default_rng(0)).all()


@pytest.mark.parametrize("preset", ["xlnet-tiny", "transfo-xl-tiny"])
def test_xlnet_flops_are_three_times_the_matmuls_of_a_forward_pass(preset):
    """cost.flops_per_sample of XLNet (both streams, the position keys over k + s distances, the segment term, the LM
    head on the predicted tokens) and of the causal Transformer-XL style (the content stream, the LM head on every
    token) equals three times the matmul FLOPs torch's FlopCounterMode counts in one forward pass, less the position
    keys' projection (once per micro-batch, not per sequence: left out)."""
    from torch.utils.flop_counter import FlopCounterMode

    from pretrain import cost, models
    from pretrain.config import load

    mcore.initialize(tp=1, seed=0)
    cfg = load(preset, ["model.vocab_size=500"])
    s, p = cfg.data.seq_len, cost.predicted_tokens(cfg)
    model = models.build(cfg.model, tp=mcore.OneRank()).eval()
    ids = torch.randint(0, 500, (2, s))
    kwargs = {"memory_mask": torch.zeros(2, cfg.model.mem_len, dtype=torch.bool)}  # a memory's keys, its slots
    assert cfg.model.mem_len > 0
    if preset == "xlnet-tiny":
        assert cost.query_tokens(cfg) == p < s
        kwargs |= dict(token_type_ids=torch.zeros_like(ids), perm_mask=torch.zeros(2, s, s, dtype=torch.bool),
                      targets=torch.arange(p).expand(2, p))
    with FlopCounterMode(display=False) as flops, torch.no_grad():
        model(ids, **kwargs)
    counts = flops.get_flop_counts()
    positions = sum(sum(counts[f"XLNet.blocks.{i}.attn.r"].values()) for i in range(cfg.model.num_layers))
    assert positions > 0 and cost.flops_per_sample(cfg) == 3 * (flops.get_total_flops() - positions) / 2


def test_permutation_samples_are_a_sep_b_sep_cls_with_their_targets_in_an_order(train_data):
    """Each sample: A [SEP] B [SEP] [CLS] (segments 0, 1, 2) of seq_len tokens, A ending at a sentence end where its
    window has one, B the rest of A's window about half the time; num_predict targets, ascending, never a functional token, labelled with their own tokens; perm_mask
    the factorisation of those targets; the same sample whenever it is read."""
    from data_prep.dataset import Corpus
    from pretrain.data.permutation import PermutationSamples

    corpus = Corpus(train_data)
    sep, cls = corpus.special_ids["sep"], corpus.special_ids["cls"]
    source = PermutationSamples(train_data, 32, 5, 16, seed=3)
    consecutive = cut_at_sentence = 0

    def sentence_flags(doc):
        flags = np.zeros(len(corpus.tokens(doc)), np.uint8)
        flags[corpus.sentence_starts(doc)] = 1
        return flags
    for i in range(40):
        s = source.sample(0, i)
        ids, seg = s["input_ids"], s["token_type_ids"]
        cut = int((seg == 0).sum()) - 1
        assert ids[cut] == sep and ids[-2] == sep and ids[-1] == cls and len(ids) == 32
        assert (seg == np.concatenate([np.zeros(cut + 1), np.ones(31 - cut - 1), [2]])).all()
        assert len(s["targets"]) == 5 and (np.diff(s["targets"]) > 0).all()
        assert not np.isin(s["targets"], [cut, 30, 31]).any() and (s["labels"] == ids[s["targets"]]).all()
        perm = s["perm_mask"]
        assert perm[s["targets"], s["targets"]].all() and not perm[:, ~np.isin(np.arange(32), [*s["targets"], cut, 30, 31])].any()
        window = source.packed(0, i, corpus.tokens, source.eod)[:29]
        consecutive += (np.concatenate([ids[:cut], ids[cut + 1:30]]) == window).all()
        sentences = np.flatnonzero(source.packed(0, i, sentence_flags, 0)[1:29]) + 1
        assert cut in sentences or not len(sentences)  # A ends where a sentence does, where the window holds one
        cut_at_sentence += len(sentences) > 0
        again = source.sample(0, i)
        assert all((again[k] == v).all() for k, v in s.items())
    assert 10 < consecutive < 30 and cut_at_sentence > 20


def test_streams_walk_the_windows_in_order_and_xlnet_reuses_the_tokens_before_a(train_data):
    """With a memory (model.mem_len > 0) the windows are read as B streams, each a contiguous run of them: sample i
    is step i // B of stream i % B. A causal LM's next window of a stream starts where its last one's labels end;
    XLNet's (reuse_len R) starts R tokens on, its reused part the R tokens that followed the last one's (which the
    memory then holds). The reused part is blind to A and B, which see all of it, and holds the larger half of the
    predictions."""
    from data_prep.dataset import Corpus
    from pretrain.data.gpt import GPTDataset
    from pretrain.data.indexes import stream_order
    from pretrain.data.permutation import PermutationSamples

    assert stream_order(10, 3).tolist() == [0, 3, 6, 1, 4, 7, 2, 5, 8]
    streams, r = 4, 8
    gpt = GPTDataset(train_data, 16, seed=3, streams=streams)
    xl = PermutationSamples(train_data, 32, 7, 0, reuse_len=r, streams=streams, seed=3)
    tokens = Corpus(train_data).tokens
    for source in (gpt, xl):
        assert len(source) % streams == 0
    for t in range(3):
        for k in range(streams):
            i, following = t * streams + k, (t + 1) * streams + k
            s, after = gpt.sample(1, i), gpt.sample(1, following)
            assert (s["stream"], s["stream_step"], s["epoch"]) == (k, t, 1)
            assert after["input_ids"][0] == s["labels"][-1] and (after["input_ids"][1:] != s["labels"][1:]).any()
            s, after = xl.sample(1, i), xl.sample(1, following)
            window = xl.packed(1, i, tokens, xl.eod)
            assert (s["input_ids"][:r] == window[:r]).all() and (after["input_ids"][:r] == window[r:2 * r]).all()
            assert s["perm_mask"][:r, r:].all() and not s["perm_mask"][r:, :r].any()
            assert (s["targets"] < r).sum() == 4 and len(s["targets"]) == 7


@pytest.mark.parametrize("preset", ["xlnet-tiny", "transfo-xl-tiny"])
def test_training_with_a_memory_computes_hfs_losses_along_the_streams(preset, train_data, tmp_path):
    """End to end, one process, micro-batches of 4 of a global batch of 8 streams, the weights held (lr 1e-12), no
    dropout: every step's logged loss equals XLNetLMHeadModel's on the same samples, its `mems` carried from step to
    step (XLNet: reuse_len 16 of 32, memory 24; Transformer-XL: memory 32), within 2e-6 (measured: 4e-7); HF without
    mems is more than 2e-5 away from step 2 on (the untrained model reads little of its memory). The same run without
    a memory but with data.streams reads the same samples in the same order (without it, others), so it logs the
    memory run's first loss (an empty memory) and not its second. Then
    scripts/memory_eval.py with the Transformer-XL run as both runs: the "other" run's weights, loaded from its
    checkpoint, evaluate exactly as these weights with the memory masked, and reading the memory changes the loss."""
    import json

    from pretrain import checkpoint as C
    from pretrain.checkpoint_manager import adopt_model_shape
    from pretrain.config import load
    from pretrain.data.factory import build_sources
    from pretrain.train import train

    b, steps, s = 8, 4, 32
    xl = preset == "xlnet-tiny"
    memory = ["model.reuse_len=16", "model.mem_len=24", "xlnet.perm_size=16"] if xl else ["model.mem_len=32"]
    overrides = [f"data.path={train_data}", f"data.seq_len={s}", "model.max_position_embeddings=32",
                 "model.hidden_dropout=0", "model.attention_dropout=0", f"train.global_batch_size={b}",
                 "train.micro_batch_size=4", f"train.steps={steps}", "optimizer.lr=1e-12", "optimizer.min_lr=0",
                 "optimizer.warmup_steps=0", "train.eval_interval=0", "data.valid_fraction=0.2", "data.num_workers=0",
                 "train.log_interval=1"]
    cfg = load(preset, [*overrides, *memory, f"out_dir={tmp_path}"])
    train(cfg)

    def losses(run):
        return {r["step"]: r["lm_loss"] for r in map(json.loads, open(run / "metrics.jsonl")) if "lm_loss" in r}

    logged = losses(tmp_path)
    ckpt = C.resolve(str(tmp_path))
    # checkpoint.init_from with the preset's max_position_embeddings: no weight has that shape here (an XLNet from
    # from-hf says 512, HF's XLNet has no such limit), so it is no disagreement
    init = load(preset, [*overrides, *memory, "model.max_position_embeddings=128", f"checkpoint.init_from={ckpt}"])
    assert adopt_model_shape(init, ckpt) == [] and init.model.max_position_embeddings == 128
    m, adapter = C.model_config(C.read_meta(ckpt)), get("xlnet").adapter
    hf = transformers.XLNetLMHeadModel(adapter.hf_config(m, {})).eval()
    hf.load_state_dict(adapter.to_hf(C.load_full_model(ckpt), m.num_layers, m.num_heads, m.vocab_size))
    source, _ = build_sources(cfg)
    mems = None
    for t in range(steps):
        samples = [source.sample(0, t * b + k) for k in range(b)]
        batch = {k: torch.stack([torch.as_tensor(x[k]) for x in samples]) for k in samples[0]}
        assert batch["stream"].tolist() == list(range(b)) and (batch["stream_step"] == t).all()
        inputs = dict(input_ids=batch["input_ids"], labels=batch["labels"])
        if xl:
            inputs.update(token_type_ids=batch["token_type_ids"], perm_mask=batch["perm_mask"].float(),
                          target_mapping=F.one_hot(batch["targets"], s).float())
        with torch.no_grad():
            ref, alone = hf(**inputs, mems=mems, use_mems=True), hf(**inputs)
        assert abs(ref.loss.item() - logged[t + 1]) < 2e-6, t
        assert t == 0 or abs(alone.loss.item() - logged[t + 1]) > 2e-5, t
        mems = ref.mems
    # data.streams: the same run without a memory reads the same samples in the same order (shuffled without it),
    # so its first step, where the memory is still empty, is the memory run's; its second is not
    plain = [*overrides, *memory, "model.mem_len=0", "train.steps=2"]
    streamed = load(preset, [*plain, "data.streams=true", f"out_dir={tmp_path / 'plain'}"])
    for other, same in ((build_sources(streamed)[0], True), (build_sources(load(preset, plain))[0], False)):
        assert all((other.sample(0, i)["input_ids"] == source.sample(0, i)["input_ids"]).all()
                   for i in range(steps * b)) == same
    train(streamed)
    alone = losses(tmp_path / "plain")
    assert abs(alone[1] - logged[1]) < 1e-6 and abs(alone[2] - logged[2]) > 2e-5, (alone, logged)
    if not xl:  # scripts/memory_eval.py on this run as both runs: the other run's weights load exactly, the memory is read
        import subprocess
        import sys

        from conftest import ROOT
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "memory_eval.py"), str(tmp_path),
                               str(tmp_path), "--eval-steps", "3"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        rows = json.loads(proc.stdout.strip().splitlines()[-1])
        loss = {name: row["valid_lm_loss"] for name, row in rows.items()}
        assert loss["memory masked"] == loss["without memory"] != loss["with memory"], loss
