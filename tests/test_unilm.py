"""UniLM: each sample's self-attention mask (bidirectional, left-to-right, right-to-left, seq2seq) as published, drawn
from the sample alone in the published mix; the model under each mask equals transformers' BertForMaskedLM given the
same mask; the exported model decodes a target from a source as ptm's own decoding does."""
import pytest
import torch

from conftest import call_cli
from data_prep.tokenizer import load_tokenizer
from pretrain import checkpoint as C
from pretrain.models.config import ModelConfig
from pretrain.models.model import Pretraining, span_mask
from pretrain.objectives.unilm import MODES, decode, sample_modes, spans
from pretrain.parallel import mcore

transformers = pytest.importorskip("transformers", reason="transformers not installed (scripts/setup.sh installs it)")
V, S = 99, 12


@pytest.fixture(scope="module", autouse=True)
def one_process_group():
    mcore.initialize(tp=1, seed=0)


def _batch():
    """Four samples, one per mode: [CLS] source [SEP] target [SEP] and padding, sources of different lengths."""
    lengths, sources = [12, 10, 9, 11], [5, 3, 4, 6]
    mask = (torch.arange(S)[None] < torch.tensor(lengths)[:, None]).long()
    types = ((torch.arange(S)[None] >= torch.tensor(sources)[:, None]) & mask.bool()).long()
    return torch.arange(len(MODES)), mask, types


def test_each_mode_sees_what_the_paper_says():
    modes, mask, types = _batch()
    seen = span_mask(*spans(modes, mask, types))
    for b, mode in enumerate(MODES):
        n, source = int(mask[b].sum()), int(((types[b] == 0) & mask[b].bool()).sum())
        for i in range(n):
            for j in range(S):
                real = j < n
                expected = {"bidirectional": real, "left_to_right": j <= i, "right_to_left": i <= j < n,
                            "seq2seq": j < source if i < source else j <= i}[mode]
                assert bool(seen[b, i, j]) == expected, (mode, i, j)
        assert seen[b, n:, :n].all() and not seen[b, n:, n:].any()  # padding rows see the real tokens only


def test_modes_follow_the_mix_and_belong_to_the_sample_alone():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 30000, (24000, 16), generator=g)
    mix = {"bidirectional": 2.0, "left_to_right": 1.0, "right_to_left": 1.0, "seq2seq": 2.0}
    modes = sample_modes(ids, mix)
    shares = torch.bincount(modes, minlength=4).double() / len(ids)
    expected = torch.tensor([1 / 3, 1 / 6, 1 / 6, 1 / 3], dtype=torch.float64)
    assert (shares - expected).abs().max() < 4 * (expected * (1 - expected) / len(ids)).sqrt().max()
    assert torch.equal(sample_modes(ids[5000:5100], mix), modes[5000:5100])  # a sample's mode, whatever its batch
    assert sample_modes(ids, {"seq2seq": 1.0}).eq(3).all()


def _exported(tmp_path, vocab_file):
    """A ptm BERT without NSP (random weights, biases and LayerNorms: every parameter matters), and the
    BertForMaskedLM that `ptm convert to-hf` makes of it."""
    tok = load_tokenizer(vocab_file)
    cfg = ModelConfig(arch="bert", heads=["mlm"], vocab_size=tok.vocab_size, vocab_pad_to=128, hidden_size=32,
                      num_layers=2, num_heads=4, ffn_hidden_size=48, max_position_embeddings=32, hidden_dropout=0,
                      attention_dropout=0, init_std=0.2)
    torch.manual_seed(0)
    ours = Pretraining(cfg).eval()
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(mean=1.0 if "norm.weight" in name else 0.0, std=0.1)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    C.save_model(str(ckpt), ours.state_dict())
    tok.save(str(tmp_path / "tok"))
    C.copy_tokenizer(str(tmp_path / "tok"), str(ckpt))
    C.write_meta(str(ckpt), model=cfg, params=C.param_info(ours.named_parameters()), step=1)
    call_cli("checkpoints_tools", "to-hf", ckpt, "--out", tmp_path / "hf")
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "BertForMaskedLM"
    return tok, ours, hf


def test_the_model_under_each_mask_equals_bert_for_masked_lm(tmp_path, wordpiece_vocab):
    """Through the export: BertForMaskedLM given each mode's mask as a 4-D boolean attention mask gives ptm's logits."""
    tok, ours, hf = _exported(tmp_path, wordpiece_vocab)
    modes, mask, types = _batch()
    ids = torch.randint(5, tok.vocab_size, (len(modes), S), generator=torch.Generator().manual_seed(1)) * mask
    lo, hi = spans(modes, mask, types)
    with torch.no_grad():
        mine = ours(ids, mask, types, attend_lo=lo, attend_hi=hi)["logits"][..., :tok.vocab_size]
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=span_mask(lo, hi)[:, None]).logits
        plain = ours(ids, mask, types)["logits"][..., :tok.vocab_size]
    real = mask.bool()
    torch.testing.assert_close(mine[real], ref[real], rtol=0, atol=1e-5)
    assert (plain - mine)[real].abs().amax() > 1e-2  # the masks change the logits: the comparison can tell


def test_the_exported_model_decodes_as_ptm_does(tmp_path, wordpiece_vocab):
    """Greedy seq2seq decoding (a [MASK] appended and predicted at each step) with the exported BertForMaskedLM under
    the seq2seq mask gives ptm's tokens; decoding without the mask gives others."""
    tok, ours, hf = _exported(tmp_path, wordpiece_vocab)
    special = {k: tok.special[k] for k in ("cls", "sep", "mask")}
    source = tok.encode(["the function returns the sum of two numbers"])[0].tolist()

    def ptm(x, types, lo, hi):
        return ours(x, torch.ones_like(x), types, attend_lo=lo, attend_hi=hi)["logits"][0, -1, :tok.vocab_size]

    def transformers_model(x, types, lo, hi):
        return hf(input_ids=x, token_type_ids=types, attention_mask=span_mask(lo, hi)[:, None]).logits[0, -1]

    def unmasked(x, types, lo, hi):
        return ptm(x, types, torch.zeros_like(lo), lo.new_full(lo.shape, x.shape[1] - 1))

    def first_logits(model):
        seen = []
        decode(lambda *args: seen.append(model(*args)) or seen[-1], source, 1, special)
        return seen[0]

    with torch.no_grad():
        mine, theirs = decode(ptm, source, 8, special), decode(transformers_model, source, 8, special)
        logits = first_logits(ptm), first_logits(unmasked)
    assert mine == theirs and len(mine) == 8
    # the seq2seq mask decides what is predicted: without it the logits differ, so the comparison can tell (not the
    # greedy tokens: with random weights and a vocabulary that HF's WordPiece trainer orders differently on every run,
    # those can coincide)
    assert (logits[0] - logits[1]).abs().max() > 1e-3
