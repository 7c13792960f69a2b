"""to-hf / from-hf: transformers loads what ptm writes (weights, config, tokenizer) and the reverse."""
import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
import torch

from conftest import call_cli, run_cli
from data_prep.tokenizer import load_tokenizer
from pretrain import checkpoint as C
from pretrain.models.config import ModelConfig
from pretrain.models.model import Pretraining
from pretrain.parallel import mcore

transformers = pytest.importorskip("transformers", reason="transformers not installed (scripts/setup.sh installs it)")


@pytest.fixture(scope="module", autouse=True)
def one_process_group():
    mcore.initialize(tp=1, seed=0)


def _checkpoint(tmp_path, arch, tok_dir, nfkc=True, **features):
    tok = load_tokenizer(tok_dir)
    cfg = ModelConfig(**{**dict(
        arch=arch, vocab_size=tok.vocab_size, hidden_size=32, num_layers=2, num_heads=4,
        ffn_hidden_size=128 if arch == "gpt" else 64, max_position_embeddings=64,  # GPT's MLP: 4 x hidden
        type_vocab_size={"gpt2": 0, "gpt": 0, "gpt3": 0, "roberta": 1, "t5": 0, "bart": 0, "xlnet": 0}.get(arch, 2),
        layer_norm_eps=1e-5 if arch in ("gpt2", "gpt", "gpt3", "bart") else 1e-12, hidden_dropout=0,
        attention_dropout=0, pad_token_id=tok.special["pad"] if arch == "roberta" else -1), **features})
    from helpers import run_at_init

    model, _ = run_at_init(cfg, tok_dir, tmp_path, nfkc=nfkc)
    return model, cfg


def test_bert_to_hf_loads_in_transformers_with_its_tokenizer(sp_model, tmp_path):
    model, cfg = _checkpoint(tmp_path, "bert", sp_model)
    out = tmp_path / "hf"
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")  # a directory that is no export: refused, left as it was
    refused = call_cli("checkpoints_tools", "to-hf", tmp_path / "run", "--out", tmp_path / "notes", check=False)
    assert refused.returncode == 2 and "holds files but no config.json" in refused.stderr
    assert os.listdir(tmp_path / "notes") == ["todo.txt"]
    for f in (tmp_path / "run" / "checkpoints").glob("step_*/tokenizer/*"):
        f.chmod(0o600)  # a checkpoint's files of a mode of their own: the export's files take the umask's
    call_cli("checkpoints_tools", "to-hf", tmp_path / "run", "--out", out)  # one file; then shards replace it
    assert (out / "model.safetensors").is_file()
    call_cli("checkpoints_tools", "to-hf", tmp_path / "run", "--out", out,  # a run dir: its latest checkpoint
             "--max-shard-size", "200KB")
    assert (out / "model.safetensors.index.json").is_file() and len(list(out.glob("model-*.safetensors"))) > 1
    assert not (out / "model.safetensors").exists() and not list(tmp_path.glob("hf.*"))
    # weights and checkpoint shards as readable as the files beside them (safetensors 0.8 writes 0600)
    mode = lambda path: path.stat().st_mode & 0o777  # noqa: E731
    shards = list((tmp_path / "run").glob("checkpoints/step_*/shards/*.safetensors"))
    assert shards and {mode(p) for p in [*out.iterdir(), *shards]} == {mode(out / "config.json")}
    hf = transformers.AutoModelForPreTraining.from_pretrained(out).eval()
    assert type(hf).__name__ == "BertForPreTraining"
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "Return the sum of two numbers. 这是一个测试。"
    enc = tok(text, "Second segment here.", return_tensors="pt")
    ours_tok = load_tokenizer(sp_model)
    ids, _, _, _ = ours_tok.encode([text])
    assert enc["input_ids"][0, 1:len(ids) + 1].tolist() == ids.tolist()  # same ids as data_prep
    assert enc["input_ids"][0, 0] == ours_tok.special["cls"] and enc["token_type_ids"][0, -1] == 1
    with torch.no_grad():
        ref = hf(**enc)
        mine = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    torch.testing.assert_close(mine["logits"][..., :cfg.vocab_size], ref.prediction_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(mine["nsp_logits"], ref.seq_relationship_logits, rtol=0, atol=1e-5)
    fill = transformers.pipeline("fill-mask", model=str(out), tokenizer=str(out))
    answers = fill("The function returns the [MASK] of two numbers.")
    assert len(answers) == 5 and all("token_str" in a for a in answers)


def test_to_hf_gives_its_weights_to_transformers_without_initialising_a_model(sp_model, tmp_path):
    """The export builds no initialised model to copy the weights into (one more model copy, and a random
    initialisation, at every export): transformers builds it on the meta device and takes ptm's tensors. No random
    draw runs on a real tensor; the weights saved are the checkpoint's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from checkpoints_tools.hf import to_hf

    class Draws(TorchDispatchMode):
        seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out, name = func(*args, **(kwargs or {})), func._overloadpacket.__name__
            if name in ("normal_", "uniform_", "trunc_normal_") and args[0].device.type != "meta":
                self.seen.append((name, tuple(args[0].shape)))
            return out

    model, cfg = _checkpoint(tmp_path, "bert", sp_model)
    with Draws():
        to_hf(str(tmp_path / "run"), str(tmp_path / "hf"))
    assert Draws.seen == []
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf")
    torch.testing.assert_close(hf.bert.encoder.layer[1].output.dense.weight,
                               model.state_dict()["blocks.1.mlp.fc2.weight"], rtol=0, atol=0)


@pytest.mark.parametrize("arch,vocab", [("gpt2", "gpt2_vocab"), ("gpt", "gpt2_vocab"), ("gpt", "roberta_vocab"),
                                       ("gpt", "gpt_vocab")])
def test_gpt2_and_gpt_to_hf_generate(arch, vocab, request, tmp_path):
    """roberta_vocab: the specials of data_prep's byte_bpe (</s> ends a document): the export's tokenizer ends with
    it and adds no <|endoftext|> past the model's vocabulary. gpt_vocab: GPT's own kind of BPE (pieces ending words in
    </w>), exported as the pipeline data_prep encoded with."""
    tok_dir = tmp_path / "tok"
    load_tokenizer(request.getfixturevalue(vocab)).save(str(tok_dir))
    model, cfg = _checkpoint(tmp_path, arch, str(tok_dir), nfkc=False)
    out = tmp_path / "hf"
    call_cli("checkpoints_tools", "to-hf", tmp_path / "run" / "checkpoints" / "step_00000007", "--out", out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == {"gpt2": "GPT2LMHeadModel", "gpt": "OpenAIGPTLMHeadModel"}[arch]
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert len(tok) == cfg.vocab_size and tok.eos_token_id == load_tokenizer(str(tok_dir)).special["eod"]
    enc = tok("def add(a, b): return a + b", return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model(enc["input_ids"])["logits"][..., :cfg.vocab_size], hf(**enc).logits,
                                   rtol=0, atol=1e-5)
    gen = transformers.pipeline("text-generation", model=str(out), tokenizer=str(out))
    assert gen("def add(a, b):", max_new_tokens=5, do_sample=False)[0]["generated_text"].startswith("def add(a, b):")


def _greedy(model, ids, steps: int):
    """ptm's greedy continuation of `ids`: the whole sequence through the model for each new token."""
    with torch.no_grad():
        for _ in range(steps):
            logits = model(ids)["logits"][:, -1, :model.cfg.vocab_size]
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
    return ids


def test_gpt3_exports_as_gpt_neo_and_generates_its_tokens_and_dense_as_gpt2(gpt2_vocab, tmp_path):
    """GPT-3 with layers alternating dense and local attention (a band of 4 in 12 tokens) exports as
    GPTNeoForCausalLM (attention_types, window_size; ptm's 1/sqrt(head_dim) folded into q_proj, as GPT-Neo's scores
    are unscaled): HF's logits equal ptm's and `generate` picks ptm's greedy tokens. With q, k, v biases the export is
    refused, naming the feature; all dense, it exports as GPT2LMHeadModel (c_attn biases zero)."""
    tok_dir = tmp_path / "tok"
    load_tokenizer(gpt2_vocab).save(str(tok_dir))
    sizes = dict(num_layers=4, num_heads=2, attention_window=4)
    model, cfg = _checkpoint(tmp_path / "local", "gpt3", str(tok_dir), nfkc=False, **sizes)
    assert [type(b.attn.core).__name__ for b in model.blocks] == ["DotProductAttention", "LocalAttention"] * 2
    out = tmp_path / "hf"
    call_cli("checkpoints_tools", "to-hf", tmp_path / "local" / "run", "--out", out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "GPTNeoForCausalLM" and hf.config.attention_layers == ["global", "local"] * 2
    assert hf.config.window_size == 4
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok("def add(a, b): return a + b if a else b", return_tensors="pt")
    assert enc["input_ids"].shape[1] > 3 * cfg.attention_window  # the band leaves most keys out
    with torch.no_grad():
        mine = model(enc["input_ids"])["logits"][..., :cfg.vocab_size]
        torch.testing.assert_close(mine, hf(**enc).logits, rtol=0, atol=1e-5)
        dense = Pretraining(dataclasses.replace(cfg, attention_layers=["global"])).eval()
        dense.load_state_dict(model.state_dict())
        assert (dense(enc["input_ids"])["logits"][..., :cfg.vocab_size] - mine).abs().max() > 1e-3  # the band acts
    theirs = hf.generate(**enc, max_new_tokens=8, do_sample=False, num_beams=1)
    assert torch.equal(theirs, _greedy(model, enc["input_ids"], 8))

    _checkpoint(tmp_path / "biased", "gpt3", str(tok_dir), nfkc=False, qkv_bias=True, **sizes)
    refused = run_cli("checkpoints_tools", "to-hf", tmp_path / "biased" / "run", "--out", tmp_path / "no", check=False)
    assert refused.returncode and "model.qkv_bias=True has no HF class: GPTNeoForCausalLM" in refused.stderr

    model, cfg = _checkpoint(tmp_path / "dense", "gpt3", str(tok_dir), nfkc=False, attention_layers=["global"],
                             **sizes)
    call_cli("checkpoints_tools", "to-hf", tmp_path / "dense" / "run", "--out", tmp_path / "gpt2")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "gpt2").eval()
    assert type(hf).__name__ == "GPT2LMHeadModel" and not hf.transformer.h[0].attn.c_attn.bias.any()
    with torch.no_grad():
        torch.testing.assert_close(model(enc["input_ids"])["logits"][..., :cfg.vocab_size], hf(**enc).logits,
                                   rtol=0, atol=1e-5)


def test_gpt_neo_comes_in_computing_its_logits_and_goes_back_bit_exact(gpt2_vocab, tmp_path):
    """A GPTNeoForCausalLM (layers [global, local] x 2, window 4, unscaled scores) imports as GPT-3 with
    scaled_attention=false: ptm's logits and greedy tokens are HF's, and to-hf writes its weights back bit for bit."""
    vocab = load_tokenizer(gpt2_vocab).vocab_size
    torch.manual_seed(0)
    hf = transformers.GPTNeoForCausalLM(transformers.GPTNeoConfig(
        vocab_size=vocab, max_position_embeddings=64, hidden_size=32, num_layers=4, num_heads=2, window_size=4,
        attention_types=[[["global", "local"], 2]], bos_token_id=0, eos_token_id=0)).eval()
    src = tmp_path / "src"
    hf.save_pretrained(src)
    transformers.GPT2TokenizerFast.from_pretrained(os.path.dirname(gpt2_vocab)).save_pretrained(src)
    call_cli("checkpoints_tools", "from-hf", src, "--out", tmp_path / "ckpt")
    cfg = C.model_config(C.read_meta(str(tmp_path / "ckpt")))
    assert (cfg.arch, cfg.attention_layers, cfg.attention_window, cfg.scaled_attention, cfg.qkv_bias) == (
        "gpt3", ["global", "local"], 4, False, False)
    model = Pretraining(cfg).eval()
    model.load_state_dict(C.load_full_model(str(tmp_path / "ckpt")))
    ids = torch.randint(0, vocab, (2, 14))
    with torch.no_grad():
        torch.testing.assert_close(model(ids)["logits"][..., :vocab], hf(ids).logits, rtol=0, atol=1e-5)
    assert torch.equal(hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False,
                                   num_beams=1), _greedy(model, ids, 6))
    call_cli("checkpoints_tools", "to-hf", tmp_path / "ckpt", "--out", tmp_path / "back")
    back = transformers.GPTNeoForCausalLM.from_pretrained(tmp_path / "back").state_dict()
    for k, v in hf.state_dict().items():
        assert torch.equal(v, back[k]), k


@pytest.mark.parametrize("arch", ["bert", "gpt2", "gpt", "ernie", "roberta", "albert", "nezha"])
def test_hf_to_ptm_to_hf_is_bit_exact(arch, wordpiece_vocab, gpt2_vocab, roberta_vocab, tmp_path):
    torch.manual_seed(0)
    vocab_file = {"gpt2": gpt2_vocab, "gpt": gpt2_vocab, "roberta": roberta_vocab}.get(arch, wordpiece_vocab)
    vocab = load_tokenizer(vocab_file).vocab_size
    if arch == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64)
        model = transformers.GPT2LMHeadModel(cfg)
        tok = transformers.GPT2TokenizerFast.from_pretrained(os.path.dirname(vocab_file))
    elif arch == "gpt":
        cfg = transformers.OpenAIGPTConfig(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=64)
        model = transformers.OpenAIGPTLMHeadModel(cfg)
        tok = transformers.GPT2TokenizerFast.from_pretrained(os.path.dirname(vocab_file))
    elif arch == "roberta":
        cfg = transformers.RobertaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=48, max_position_embeddings=66, type_vocab_size=1)
        model = transformers.RobertaForMaskedLM(cfg)
        tok = transformers.RobertaTokenizerFast.from_pretrained(os.path.dirname(vocab_file))
    elif arch == "albert":
        cfg = transformers.AlbertConfig(vocab_size=vocab, embedding_size=16, hidden_size=32, num_hidden_layers=3,
                                        num_attention_heads=4, intermediate_size=48, max_position_embeddings=64)
        model = transformers.AlbertForPreTraining(cfg)
        tok = transformers.BertTokenizerFast.from_pretrained(os.path.dirname(vocab_file))
    elif arch == "nezha":
        from checkpoints_tools.nezha.configuration_nezha import NezhaConfig
        from checkpoints_tools.nezha.modeling_nezha import NezhaForPreTraining

        model = NezhaForPreTraining(NezhaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=4, intermediate_size=48, max_relative_position=7))
        tok = transformers.BertTokenizerFast.from_pretrained(os.path.dirname(vocab_file))
    else:
        common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=48, max_position_embeddings=64)
        model = (transformers.ErnieForPreTraining(transformers.ErnieConfig(use_task_id=True, **common))
                 if arch == "ernie" else transformers.BertForPreTraining(transformers.BertConfig(**common)))
        tok = transformers.BertTokenizerFast.from_pretrained(os.path.dirname(vocab_file))
    src = tmp_path / "src"
    model.save_pretrained(src)
    tok.save_pretrained(src)
    call_cli("checkpoints_tools", "from-hf", src, "--out", tmp_path / "ckpt")
    call_cli("checkpoints_tools", "to-hf", tmp_path / "ckpt", "--out", tmp_path / "back")
    back = type(model).from_pretrained(tmp_path / "back")
    for k, v in model.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k
    a, b = json.load(open(src / "config.json")), json.load(open(tmp_path / "back" / "config.json"))
    for k, v in a.items():
        if k not in ("transformers_version", "dtype", "torch_dtype"):
            assert b.get(k) == v, (k, v, b.get(k))


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_a_dataset_normalised_with_nfkc_exports_a_tokenizer_that_normalises_as_it_did(arch, wordpiece_vocab,
                                                                                    roberta_vocab, tmp_path):
    """A WordPiece or byte-level BPE dataset normalised with NFKC (data_prep's default) exports a tokenizer that
    encodes raw text as data_prep did: fullwidth punctuation and letters, a ligature, a circled digit take the ids of
    their NFKC forms. BERT's and RoBERTa's classes build their pipeline from the vocabulary alone, without NFKC
    (named in tokenizer_config.json, AutoTokenizer loaded them: `，` and `ＡＢＣ` as [UNK] or bytes): the generic class
    stays."""
    import unicodedata

    tok_dir = tmp_path / "tok"
    load_tokenizer(wordpiece_vocab if arch == "bert" else roberta_vocab).save(str(tok_dir))
    _checkpoint(tmp_path, arch, str(tok_dir), nfkc=True)
    call_cli("checkpoints_tools", "to-hf", tmp_path / "run", "--out", tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "我们今天去北京，天气很好！你觉得呢？ ＡＢＣ１２３ ﬁne ①"
    ids, _, _, _ = load_tokenizer(str(tok_dir)).encode([unicodedata.normalize("NFKC", text)])
    assert tok(text, add_special_tokens=False)["input_ids"] == ids.tolist()


def test_roberta_to_hf_fills_masks_and_from_hf_takes_a_base_model(roberta_vocab, tmp_path):
    """RoBERTa exports as RobertaForMaskedLM with RoBERTa's tokenizer (<s> A </s>, same ids as data_prep) and the
    same logits; a base RobertaModel imports with its lm_head reported as initialised and the same hidden states."""
    tok_dir = tmp_path / "tok"
    load_tokenizer(roberta_vocab).save(str(tok_dir))
    model, cfg = _checkpoint(tmp_path, "roberta", str(tok_dir), nfkc=False)
    assert cfg.pad_token_id == 1
    out = tmp_path / "hf"
    call_cli("checkpoints_tools", "to-hf", tmp_path / "run", "--out", out)
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert type(hf).__name__ == "RobertaForMaskedLM" and type(tok).__name__.startswith("RobertaTokenizer") and tok.is_fast
    text = "The function returns the sum of two numbers."
    enc = tok([text, "Short one."], padding=True, return_tensors="pt")
    ids, _, _, _ = load_tokenizer(roberta_vocab).encode([text])
    assert enc["input_ids"][0].tolist() == [0, *ids.tolist(), 2] and (enc["input_ids"][1] == 1).any()
    assert tok.model_max_length == hf.config.max_position_embeddings - 2  # positions start past the padding id
    with torch.no_grad():
        torch.testing.assert_close(model(enc["input_ids"], enc["attention_mask"])["logits"][..., :cfg.vocab_size],
                                   hf(**enc).logits, rtol=0, atol=1e-5)
    answers = transformers.pipeline("fill-mask", model=str(out), tokenizer=str(out))("The function returns the <mask>.")
    assert len(answers) == 5
    piece = load_tokenizer(roberta_vocab).encode  # the mask takes the space before it, as the word it stands for did
    assert tok("returns the <mask>.")["input_ids"] == [0, *piece(["returns the"])[0].tolist(), tok.mask_token_id,
                                                       *piece(["."])[0].tolist(), 2]

    base = transformers.RobertaModel(hf.config, add_pooling_layer=False).eval()
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    proc = call_cli("checkpoints_tools", "from-hf", tmp_path / "base", "--out", tmp_path / "ckpt")
    assert "initialised (not in" in proc.stdout and "lm_head" in proc.stdout
    imported = C.model_config(C.read_meta(str(tmp_path / "ckpt")))
    assert (imported.arch, imported.pad_token_id, imported.heads) == ("roberta", 1, ["mlm"])
    ours = Pretraining(imported).eval()
    ours.load_state_dict(C.load_full_model(str(tmp_path / "ckpt")))
    with torch.no_grad():
        torch.testing.assert_close(ours.encode(enc["input_ids"], enc["attention_mask"]),
                                   base(**enc).last_hidden_state, rtol=0, atol=1e-5)


def test_albert_to_hf_and_back(sp_model, tmp_path):
    """ALBERT exports as AlbertForPreTraining (MLM + SOP heads) with the same logits; a base AlbertModel imports with
    its heads reported; a model sharing only its attention has no HF class and is refused in one line."""
    model, cfg = _checkpoint(tmp_path, "albert", sp_model, embedding_size=16)
    out = tmp_path / "hf"
    call_cli("checkpoints_tools", "to-hf", tmp_path / "run", "--out", out)
    hf = transformers.AutoModelForPreTraining.from_pretrained(out).eval()
    assert type(hf).__name__ == "AlbertForPreTraining" and hf.config.embedding_size == 16
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok("Return the sum of two numbers.", "Second segment here.", return_tensors="pt")
    with torch.no_grad():
        ref, mine = hf(**enc), model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    torch.testing.assert_close(mine["logits"][..., :cfg.vocab_size], ref.prediction_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(mine["nsp_logits"], ref.sop_logits, rtol=0, atol=1e-5)
    transformers.AlbertModel(hf.config).save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")  # transformers 5 writes a Unigram tokenizer.json alone: ptm encodes with it
    proc = call_cli("checkpoints_tools", "from-hf", tmp_path / "base", "--out", tmp_path / "ckpt")
    assert "predictions" in proc.stdout and "sop_classifier" in proc.stdout
    text = "Return the ``sum'' of two numbers, Café."
    assert load_tokenizer(str(tmp_path / "ckpt" / "tokenizer")).encode([text])[0].tolist() == tok(
        text, add_special_tokens=False)["input_ids"]
    imported = C.model_config(C.read_meta(str(tmp_path / "ckpt")))
    assert (imported.arch, imported.embedding_size, imported.share_layers, imported.activation) == (
        "albert", 16, "all", "gelu_tanh")
    _checkpoint(tmp_path / "partial", "albert", sp_model, share_layers="attention")
    proc = run_cli("checkpoints_tools", "to-hf", tmp_path / "partial" / "run", "--out", tmp_path / "no", check=False)
    assert proc.returncode == 2 and "share_layers=attention has no HF class" in proc.stderr


def test_an_uncased_albert_tokenizer_imports_and_exports_as_transformers_encodes(tmp_path):
    """A released ALBERT's tokenizer rewrites text before its sentencepiece model (`` and '' to ", accents stripped,
    lowercased; pieces <pad> <unk> [CLS] [SEP] [MASK]): data_prep reading the directory, from-hf's tokenizer and
    to-hf's export of that checkpoint encode as transformers' AlbertTokenizer does, offsets on the original text;
    the export names the model's own special pieces (no token added to the vocabulary)."""
    import sentencepiece as spm

    lines = [line.lower() for line in ["Return the sum of two numbers.", "The cafe served creme brulee.",
                                       '"Quoted" words and more quotes here.', "Hello world, hello again."] * 40]
    (tmp_path / "src").mkdir()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(tmp_path / "src" / "spiece"),
                                   vocab_size=40, pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece="<pad>",
                                   unk_piece="<unk>", control_symbols=["[CLS]", "[SEP]", "[MASK]"], minloglevel=2)
    base = tmp_path / "base"
    hf_tok = transformers.AlbertTokenizer.from_pretrained(tmp_path / "src", do_lower_case=True, keep_accents=False)
    hf_tok.save_pretrained(base)
    shutil.copy(tmp_path / "src" / "spiece.model", base)  # (transformers 5 saves tokenizer.json alone)
    config = transformers.AlbertConfig(vocab_size=40, embedding_size=8, hidden_size=16, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    transformers.AlbertModel(config).save_pretrained(base)
    texts = ["Return the Sum of TWO numbers.", "The Café served Crème Brûlée.", "``Quoted'' WORDS and \"more\""]
    want = [hf_tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    call_cli("checkpoints_tools", "from-hf", base, "--out", tmp_path / "ckpt")
    for tok in (load_tokenizer(str(base)), load_tokenizer(str(tmp_path / "ckpt" / "tokenizer"))):
        ids, counts, starts, ends = tok.encode(texts)
        assert [a.tolist() for a in np.split(ids, counts.cumsum()[:-1])] == want
        spans = np.split(np.stack([starts, ends], 1), counts.cumsum()[:-1])  # each piece's place in the text given
        assert ["".join(t[a:b] for a, b in s) for t, s in zip(texts, spans)] == texts  # ("``" for '"', "É" for "e")
    call_cli("checkpoints_tools", "to-hf", tmp_path / "ckpt", "--out", tmp_path / "hf")
    out = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert len(out) == len(hf_tok) == 40 and out.unk_token == "<unk>" and out.pad_token == "<pad>"
    assert [out(t)["input_ids"] for t in texts] == [hf_tok(t)["input_ids"] for t in texts]


SPM_PIECES = {  # sentencepiece models with the pieces of each family's released ones
    "xlnet": dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                  control_symbols=["<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"]),
    "albert": dict(pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece="<pad>", unk_piece="<unk>",
                   control_symbols=["[CLS]", "[SEP]", "[MASK]"]),
    "t5": dict(pad_id=0, eos_id=1, unk_id=2, bos_id=-1)}


@pytest.mark.parametrize("arch", ["bert", "roberta", "gpt2", "albert", "xlnet", "t5"])
def test_a_tokenizer_json_exports_as_its_family_tokenizer_encodes_offsets_included(arch, wordpiece_vocab,
                                                                                    roberta_vocab, gpt2_vocab,
                                                                                    tmp_path):
    """A family's tokenizer saved by transformers 5 (its tokenizer.json alone) trains and exports to a tokenizer that
    AutoTokenizer loads as the family's class (tokenizer_config.json names it: that class builds the same pipeline),
    with the original's special tokens (GPT-2's <|endoftext|> its unk, bos and eos; XLNet's bos and eos its config's,
    <cls> and <sep>), that encodes as ptm does (accents, CJK, digits, whitespace runs) and texts and pairs as the
    original does: ids, segments, offsets (RoBERTa's without a token's leading space, GPT-2's with it) and XLNet's own
    <sep> and <cls> (its vocabulary has <s> and </s> besides)."""
    import sentencepiece as spm

    cls = {"bert": transformers.BertTokenizer, "roberta": transformers.RobertaTokenizer,
           "gpt2": transformers.GPT2Tokenizer, "albert": transformers.AlbertTokenizer,
           "xlnet": transformers.XLNetTokenizer, "t5": transformers.T5Tokenizer}[arch]
    src = tmp_path / "src"
    src.mkdir()
    if arch in SPM_PIECES:
        lines = [f"Sentence {i} about the sum of numbers and café." for i in range(200)]
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(src / "spiece"), vocab_size=50,
                                       minloglevel=2, **SPM_PIECES[arch])
    vocab = {"bert": wordpiece_vocab, "roberta": roberta_vocab, "gpt2": gpt2_vocab}.get(arch)
    original = cls.from_pretrained(os.path.dirname(vocab) if vocab else src)
    original.save_pretrained(tmp_path / "saved")
    assert "tokenizer.json" in os.listdir(tmp_path / "saved") and not {"vocab.txt", "vocab.json", "spiece.model"} & set(
        os.listdir(tmp_path / "saved"))
    ours = load_tokenizer(str(tmp_path / "saved")).save(str(tmp_path / "tok"))
    assert ours.kind == "tokenizer_json"
    shape = {"t5": dict(decoder_layers=1), "albert": dict(embedding_size=16)}.get(arch, {})
    _checkpoint(tmp_path, arch, str(tmp_path / "tok"), nfkc=False, **shape)
    call_cli("checkpoints_tools", "to-hf", tmp_path / "run", "--out", tmp_path / "hf")
    export = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert type(export) is cls and json.load(open(tmp_path / "hf" / "tokenizer_config.json"))["tokenizer_class"] == \
        cls.__name__
    assert export.special_tokens_map == {**original.special_tokens_map,
                                         **{"xlnet": dict(bos_token="<cls>", eos_token="<sep>")}.get(arch, {})}
    texts = ["Café, naïve résumé; ÅNGSTRÖM", "这是一个测试。数字", "digits 12345 and 3.14", "tabs\t\tand   runs  \n\n end "]
    ids, counts, _, _ = ours.encode(texts)
    encoded = [x.tolist() for x in np.split(ids, counts[:-1].cumsum())]  # (ptm's: what the model was trained on)
    assert export(texts, add_special_tokens=False)["input_ids"] == encoded
    for args in ((" It was the sum.",), ("Who?", " It was here, café."), ("Hello world",)):
        got, want = export(*args, return_offsets_mapping=True), original(*args, return_offsets_mapping=True)
        assert {k: got[k] for k in want} == dict(want), args


def test_a_sentencepiece_tokenizer_exports_its_own_cls_and_sep_pieces(tmp_path):
    """An imported sentencepiece model whose cls and sep are <s> and </s> (no [CLS], [SEP]): the export's template
    puts them where ptm's training inputs do (cls A sep B sep, B of type 1; RoBERTa's cls A sep sep B sep); to-hf of a
    model whose tokenizer has no cls is refused in one line naming the piece. The family's tokenizer class would build
    its own pipeline around the pieces (BERT's WordPiece): the export stays transformers' generic class."""
    import sentencepiece as spm

    from checkpoints_tools.hf import export_tokenizer

    lines = ["Return the sum of two numbers.", "Hello world, hello again."] * 40
    for name, pieces in (("s", dict(pad_id=3, pad_piece="<pad>", control_symbols=["<mask>"])),  # <unk> <s> </s>
                         ("no_cls", dict(bos_id=-1))):
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_prefix=str(tmp_path / name), vocab_size=28,
                                       minloglevel=2, **pieces)
    tok = load_tokenizer(str(tmp_path / "s.model")).save(str(tmp_path / "tok"))
    cls, sep = tok.special["cls"], tok.special["sep"]
    assert (tok.piece(cls), tok.piece(sep)) == ("<s>", "</s>")
    ids, counts, _, _ = tok.encode(["Return the sum.", "Hello world."])
    a, b = (x.tolist() for x in np.split(ids, counts[:1]))
    for template, want in (("bert", [cls, *a, sep, *b, sep]), ("roberta", [cls, *a, sep, sep, *b, sep])):
        export_tokenizer(str(tmp_path / "tok"), str(tmp_path / template), template, False, 64,
                         tokenizer_class={"bert": "BertTokenizer", "roberta": "RobertaTokenizer"}[template])
        hf = transformers.AutoTokenizer.from_pretrained(tmp_path / template)
        assert type(hf).__name__ == "TokenizersBackend"
        enc = hf("Return the sum.", "Hello world.")
        assert enc["input_ids"] == want and (hf.cls_token, hf.sep_token) == ("<s>", "</s>"), (template, enc)
        assert template == "roberta" or enc["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    load_tokenizer(str(tmp_path / "no_cls.model")).save(str(tmp_path / "no_cls"))
    _checkpoint(tmp_path, "bert", str(tmp_path / "no_cls"))
    proc = call_cli("checkpoints_tools", "to-hf", tmp_path / "run", "--out", tmp_path / "hf", check=False)
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]  # (after the weights' progress bar)
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "has no cls piece ([CLS], <cls> or <s>), which the bert template puts around" in errors[0]
    assert not (tmp_path / "hf").exists()


def test_export_refuses_what_the_family_class_does_not_compute(sp_model, gpt2_vocab, tmp_path):
    """`arch` picks the HF class, and the class must compute the model: a causal BERT, or a GPT-2 with post-LN and GELU,
    is refused with one line per feature (else the export would load as a different model)."""
    _checkpoint(tmp_path / "bert", "bert", sp_model, causal=True)
    proc = run_cli("checkpoints_tools", "to-hf", tmp_path / "bert" / "run", "--out", tmp_path / "no", check=False)
    errors = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "model.causal=True has no HF class: BertForPreTraining computes causal = False" in errors[0]
    tok_dir = tmp_path / "tok"
    load_tokenizer(gpt2_vocab).save(str(tok_dir))
    _checkpoint(tmp_path / "gpt2", "gpt2", str(tok_dir), nfkc=False, norm="post", activation="gelu")
    proc = run_cli("checkpoints_tools", "to-hf", tmp_path / "gpt2" / "run", "--out", tmp_path / "no", check=False)
    errors = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(errors) == 2 and not (tmp_path / "no").exists(), proc.stderr
    assert "model.norm=post has no HF class" in errors[0] and "model.activation=gelu has no HF class" in errors[1]



def test_only_t5_exports_heads_of_another_width_than_hidden_over_heads():
    """model.head_dim (T5 1.1 small's 6 heads of 64 in 512): T5's class takes it as d_kv; BART's and BERT's split the
    hidden size over the heads, so their export refuses it in one line naming the setting."""
    from pretrain.families import get
    from pretrain.models.config import ModelConfig

    sizes = dict(hidden_size=32, num_heads=4, head_dim=12, decoder_layers=1, type_vocab_size=0)
    assert get("t5").adapter.problems(ModelConfig(arch="t5", **sizes)) == []
    assert get("t5").adapter.hf_config(ModelConfig(arch="t5", **sizes), {}).d_kv == 12
    for arch in ("bart", "bert"):
        errors = get(arch).adapter.problems(ModelConfig(arch=arch, **sizes))
        assert len(errors) == 1 and errors[0].startswith("model.head_dim=12 has no HF class"), errors
    assert get("bert").adapter.problems(ModelConfig(arch="bert", **{**sizes, "head_dim": 8})) == []  # = 32 / 4


def test_electra_exports_discriminator_and_generator_and_comes_back(sp_model, tmp_path):
    """ELECTRA exports the discriminator as ElectraForPreTraining and the generator as ElectraForMaskedLM in
    generator/, each with the shared embeddings and the same outputs; from-hf of that directory restores every weight
    bit for bit; a discriminator alone imports with a new generator, reported; the generator alone is refused."""
    model, cfg = _checkpoint(tmp_path, "electra", sp_model, generator_size=0.5)
    out = tmp_path / "hf"
    call_cli("checkpoints_tools", "to-hf", tmp_path / "run", "--out", out)
    disc = transformers.AutoModelForPreTraining.from_pretrained(out).eval()
    gen = transformers.AutoModelForMaskedLM.from_pretrained(out / "generator").eval()
    assert (type(disc).__name__, type(gen).__name__) == ("ElectraForPreTraining", "ElectraForMaskedLM")
    assert (gen.config.hidden_size, gen.config.num_attention_heads, gen.config.embedding_size) == (16, 2, 32)
    tok = transformers.AutoTokenizer.from_pretrained(out / "generator")
    enc = tok(["Return the sum of two numbers.", "Short."], padding=True, return_tensors="pt")
    inputs = (enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    with torch.no_grad():
        torch.testing.assert_close(model(*inputs)["rtd_logits"], disc(**enc).logits, rtol=0, atol=1e-5)
        torch.testing.assert_close(model.generator(*inputs)["logits"][..., :cfg.vocab_size], gen(**enc).logits,
                                   rtol=0, atol=1e-5)
    call_cli("checkpoints_tools", "from-hf", out, "--out", tmp_path / "ckpt")
    mine, back = C.load_full_model(str(tmp_path / "run" / "checkpoints" / "step_00000007")), \
        C.load_full_model(str(tmp_path / "ckpt"))
    assert mine.keys() == back.keys() and all(torch.equal(mine[k][:cfg.vocab_size], back[k]) for k in mine)
    imported = C.model_config(C.read_meta(str(tmp_path / "ckpt")))
    assert (imported.arch, imported.generator_size, imported.heads) == ("electra", 0.5, ["rtd"])
    padded = C.load_model_shard(str(tmp_path / "ckpt"), 0, 1, vocab_rows=cfg.padded_vocab)  # checkpoint.init_from's
    assert all(len(padded[k]) == cfg.padded_vocab for k in ("embeddings.word.weight", "generator.mlm.bias"))
    split = call_cli("checkpoints_tools", "reshard", tmp_path / "ckpt", "--out", tmp_path / "tp4", "--tp", "4",
                     check=False)  # the discriminator's 4 heads split 4 ways, the generator's 2 do not
    assert split.returncode == 2 and "the companion model's num_heads=2" in split.stderr, split.stderr

    shutil.rmtree(out / "generator")
    proc = call_cli("checkpoints_tools", "from-hf", out, "--out", tmp_path / "alone")
    assert "generator.blocks.0" in proc.stdout
    assert C.model_config(C.read_meta(str(tmp_path / "alone"))).generator_size == 0.25
    gen.save_pretrained(tmp_path / "gen")
    proc = run_cli("checkpoints_tools", "from-hf", tmp_path / "gen", "--out", tmp_path / "no", check=False)
    assert proc.returncode == 2 and "this is ELECTRA's generator (ElectraForMaskedLM)" in proc.stderr


def test_nezha_exports_with_its_modeling_file(sp_model, tmp_path):
    """transformers has no NEZHA class: the export carries ptm's modeling file and an auto_map, and AutoModel loads it
    with trust_remote_code=True (the file copied into transformers' module cache, not ptm's package) with the same
    outputs; without trust_remote_code transformers refuses it; from-hf restores the weights bit for bit."""
    model, cfg = _checkpoint(tmp_path, "nezha", sp_model, max_relative_position=3)
    out = tmp_path / "hf"
    call_cli("checkpoints_tools", "to-hf", tmp_path / "run", "--out", out)
    assert {"modeling_nezha.py", "configuration_nezha.py"} <= {f.name for f in out.iterdir()}
    assert json.load(open(out / "config.json"))["auto_map"]["AutoModelForPreTraining"] == \
        "modeling_nezha.NezhaForPreTraining"
    hf = transformers.AutoModelForPreTraining.from_pretrained(out, trust_remote_code=True).eval()
    assert type(hf).__name__ == "NezhaForPreTraining" and not type(hf).__module__.startswith("checkpoints_tools")
    assert hf.config.max_relative_position == 3
    base = transformers.AutoModel.from_pretrained(out, trust_remote_code=True).eval()
    masked_lm = transformers.AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    enc = tok(["Return the sum of two numbers, a long sentence.", "Short."], padding=True, return_tensors="pt")
    assert enc["attention_mask"].min() == 0 and enc["input_ids"].shape[1] > 2 * 3 + 1  # padding; distances clipped
    with torch.no_grad():
        ref, mine = hf(**enc), model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        torch.testing.assert_close(model.encode(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]),
                                   base(**enc).last_hidden_state, rtol=0, atol=1e-5)
    torch.testing.assert_close(mine["logits"][..., :cfg.vocab_size], ref.prediction_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(mine["nsp_logits"], ref.seq_relationship_logits, rtol=0, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(masked_lm(**enc).logits, ref.prediction_logits, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="trust_remote_code"):
        transformers.AutoModel.from_pretrained(out, trust_remote_code=False)
    call_cli("checkpoints_tools", "from-hf", out, "--out", tmp_path / "ckpt")
    mine, back = C.load_full_model(str(tmp_path / "run" / "checkpoints" / "step_00000007")), \
        C.load_full_model(str(tmp_path / "ckpt"))
    assert mine.keys() == back.keys() and all(torch.equal(mine[k][:cfg.vocab_size], back[k]) for k in mine)
    imported = C.model_config(C.read_meta(str(tmp_path / "ckpt")))
    assert (imported.arch, imported.position_encoding, imported.max_relative_position) == ("nezha", "relative", 3)


def test_from_hf_base_model_initialises_and_reports_heads(wordpiece_vocab, tmp_path):
    cfg = transformers.BertConfig(vocab_size=load_tokenizer(wordpiece_vocab).vocab_size, hidden_size=32,
                                  num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
    transformers.BertModel(cfg).save_pretrained(tmp_path / "base")
    transformers.BertTokenizerFast.from_pretrained(os.path.dirname(wordpiece_vocab)).save_pretrained(tmp_path / "base")
    proc = call_cli("checkpoints_tools", "from-hf", tmp_path / "base", "--out", tmp_path / "ckpt")
    assert "initialised (not in" in proc.stdout and "cls.predictions" in proc.stdout
    meta = C.read_meta(str(tmp_path / "ckpt"))
    assert any(k.startswith("cls.seq_relationship") for k in meta["initialised"])
    # another import into it, or into a directory of other files, is refused; nothing is written there
    again = run_cli("checkpoints_tools", "from-hf", tmp_path / "base", "--out", tmp_path / "ckpt", check=False)
    assert again.returncode == 2 and "already holds a checkpoint; choose another --out" in again.stderr
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    busy = run_cli("checkpoints_tools", "from-hf", tmp_path / "base", "--out", tmp_path / "busy", check=False)
    assert busy.returncode == 2 and "is a directory that is not empty" in busy.stderr
    assert os.listdir(tmp_path / "busy") == ["notes.txt"] and not os.path.exists(tmp_path / "busy.tmp")


def test_bad_checkpoint_path_is_one_clear_line(tmp_path):
    proc = run_cli("checkpoints_tools", "to-hf", tmp_path, "--out", tmp_path / "o", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("checkpoints_tools: error: ")
    assert "neither a ptm checkpoint" in proc.stderr


def test_from_hf_without_config_is_one_clear_line(tmp_path):
    src = tmp_path / "weights_only"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"not a model")
    proc = run_cli("checkpoints_tools", "from-hf", src, "--out", tmp_path / "ckpt", check=False)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"checkpoints_tools: error: {src} has no config.json")
    assert "save_pretrained" in lines[0] and not (tmp_path / "ckpt").exists()


def test_t5_to_hf_generates_with_its_sentinels_and_comes_back(t5_data, tmp_path):
    """T5 exports as T5ForConditionalGeneration with a tokenizer that ends each sequence with the end-of-sequence
    token and holds the 100 sentinels after the vocabulary (<extra_id_0> last, as the dataset numbers them): its ids
    are data_prep's, HF's logits equal ptm's, `generate` picks ptm's greedy tokens, and from-hf restores the weights
    bit for bit (the vocabulary's padding rows aside) and the longest input (T5's config has none: the tokenizer's
    model_max_length, which to-hf writes back)."""
    from checkpoints_tools.hf import to_hf
    from data_prep.dataset import Corpus

    model, cfg = _checkpoint(tmp_path, "t5", os.path.join(t5_data, "tokenizer"), decoder_layers=2)
    out = tmp_path / "hf"
    call_cli("checkpoints_tools", "to-hf", tmp_path / "run", "--out", out)
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert type(hf).__name__ == "T5ForConditionalGeneration"
    corpus, ours_tok = Corpus(t5_data), load_tokenizer(t5_data)
    assert tok.convert_tokens_to_ids([f"<extra_id_{k}>" for k in range(100)]) == corpus.sentinel_ids
    text = "The function returns the sum of two numbers. 这是一个测试。"
    enc = tok([text, "A shorter one."], padding=True, return_tensors="pt")
    ids, _, _, _ = ours_tok.encode([text])
    assert enc["input_ids"][0].tolist() == ids.tolist() + [corpus.special_ids["eod"]]
    start = hf.config.decoder_start_token_id
    assert start == corpus.special_ids["pad"] and hf.config.eos_token_id == corpus.special_ids["eod"]
    decoder = torch.full((2, 1), start)
    with torch.no_grad():
        mine = model(enc["input_ids"], enc["attention_mask"], decoder)["logits"][..., :cfg.vocab_size]
        torch.testing.assert_close(mine, hf(**enc, decoder_input_ids=decoder).logits, rtol=1e-5, atol=1e-5)
    greedy = model.greedy(enc["input_ids"], enc["attention_mask"], max_new_tokens=6, start=start,
                          eos=hf.config.eos_token_id, pad=start)
    assert torch.equal(hf.generate(**enc, max_new_tokens=6, do_sample=False, num_beams=1), greedy)
    call_cli("checkpoints_tools", "from-hf", out, "--out", tmp_path / "back")
    back, mine = C.load_full_model(str(tmp_path / "back")), C.load_full_model(C.resolve(str(tmp_path / "run")))
    assert back.keys() == mine.keys()
    assert all(torch.equal(back[k], mine[k][:back[k].shape[0]]) for k in back)
    imported = C.model_config(C.read_meta(str(tmp_path / "back")))
    assert (imported.decoder_layers, imported.max_position_embeddings) == (2, cfg.max_position_embeddings)
    to_hf(str(tmp_path / "back"), str(tmp_path / "again"))  # the longest input: T5's config has none, its tokenizer's
    assert [json.load(open(d / "tokenizer_config.json"))["model_max_length"] for d in (out, tmp_path / "again")] == [
        cfg.max_position_embeddings] * 2


def test_xlnet_to_hf_with_its_tokenizer_and_back(sp_model, tmp_path):
    """XLNet exports as XLNetLMHeadModel with a tokenizer that lays out A [SEP] B [SEP] [CLS] (segments 0, 1, 2) and
    pads on the left: its ids are data_prep's, HF's logits equal ptm's (padding and segments included), and from-hf
    restores the weights bit for bit (padding rows aside) and the longest input, which XLNet's config does not hold:
    the tokenizer's model_max_length (transformers' "no limit" too) comes back from to-hf as it was."""
    from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

    from checkpoints_tools.hf import to_hf
    from ptm.files import write_json

    model, cfg = _checkpoint(tmp_path, "xlnet", sp_model)
    out = tmp_path / "hf"
    call_cli("checkpoints_tools", "to-hf", tmp_path / "run", "--out", out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert type(hf).__name__ == "XLNetLMHeadModel"
    special, ours_tok = load_tokenizer(sp_model).special, load_tokenizer(sp_model)
    first, second = "The function returns the sum of two numbers.", "Short."
    enc = tok([first, "A b."], [second, second], padding=True, return_tensors="pt")
    a, _, _, _ = ours_tok.encode([first])
    b, _, _, _ = ours_tok.encode([second])
    assert enc["input_ids"][0].tolist() == [*a.tolist(), special["sep"], *b.tolist(), special["sep"], special["cls"]]
    assert enc["token_type_ids"][0].tolist() == [0] * (len(a) + 1) + [1] * (len(b) + 1) + [2]
    assert enc["attention_mask"][1, 0] == 0 and enc["input_ids"][1, -1] == special["cls"]  # padded on the left
    with torch.no_grad():
        mine = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])["logits"][..., :cfg.vocab_size]
        torch.testing.assert_close(mine, hf(**enc).logits, rtol=1e-5, atol=1e-5)
    config = json.load(open(out / "tokenizer_config.json"))
    assert config["model_max_length"] == cfg.max_position_embeddings
    # the source says "no limit", as transformers' XLNetTokenizer saves it
    write_json(out / "tokenizer_config.json", {**config, "model_max_length": VERY_LARGE_INTEGER})
    call_cli("checkpoints_tools", "from-hf", out, "--out", tmp_path / "back")
    back, mine = C.load_full_model(str(tmp_path / "back")), C.load_full_model(C.resolve(str(tmp_path / "run")))
    assert back.keys() == mine.keys() and all(torch.equal(back[k], mine[k][:back[k].shape[0]]) for k in back)
    to_hf(str(tmp_path / "back"), str(tmp_path / "again"))  # the longest input: its tokenizer's (XLNet's config: none)
    assert json.load(open(tmp_path / "again" / "tokenizer_config.json"))["model_max_length"] == VERY_LARGE_INTEGER


def test_bart_to_hf_generates_and_comes_back(sp_model, tmp_path):
    """BART exports as BartForConditionalGeneration with a tokenizer that wraps a sequence in [CLS] ... [SEP] (BART's
    <s> ... </s>) and knows the mask token: its ids are data_prep's, HF's logits equal ptm's, `generate` (from </s>,
    BART's decoder start) picks ptm's greedy tokens, and from-hf restores the weights bit for bit (padding rows
    aside)."""
    model, cfg = _checkpoint(tmp_path, "bart", sp_model, decoder_layers=2, position_offset=2)
    out = tmp_path / "hf"
    call_cli("checkpoints_tools", "to-hf", tmp_path / "run", "--out", out)
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert type(hf).__name__ == "BartForConditionalGeneration"
    special = load_tokenizer(sp_model).special
    text = "The function returns the sum of two numbers."
    enc = tok([text + " [MASK] again.", "A shorter one."], padding=True, return_tensors="pt")
    ids, _, _, _ = load_tokenizer(sp_model).encode([text])
    assert enc["input_ids"][0, 0] == special["cls"] and enc["input_ids"][0, 1:len(ids) + 1].tolist() == ids.tolist()
    assert special["mask"] in enc["input_ids"][0].tolist()
    start = hf.config.decoder_start_token_id
    assert start == hf.config.eos_token_id == special["eod"] and hf.config.pad_token_id == special["pad"]
    assert (tok.bos_token_id, tok.eos_token_id) == (hf.config.bos_token_id, hf.config.eos_token_id)
    assert tok.model_max_length == hf.config.max_position_embeddings == cfg.max_position_embeddings - 2  # its offset
    longest = tok(" ".join(["word"] * 400), truncation=True, return_tensors="pt")["input_ids"]
    assert longest.shape[1] == tok.model_max_length
    with torch.no_grad():
        hf(input_ids=longest, decoder_input_ids=longest)  # every position the tokenizer gives has a row
    decoder = torch.full((2, 1), start)
    with torch.no_grad():
        mine = model(enc["input_ids"], enc["attention_mask"], decoder)["logits"][..., :cfg.vocab_size]
        torch.testing.assert_close(mine, hf(**enc, decoder_input_ids=decoder).logits, rtol=1e-5, atol=1e-5)
    greedy = model.greedy(enc["input_ids"], enc["attention_mask"], max_new_tokens=6, start=start, eos=start,
                          pad=special["pad"])
    theirs = hf.generate(**enc, max_new_tokens=6, do_sample=False, num_beams=1, forced_eos_token_id=None)
    assert torch.equal(theirs, greedy)
    call_cli("checkpoints_tools", "from-hf", out, "--out", tmp_path / "back")
    back, mine = C.load_full_model(str(tmp_path / "back")), C.load_full_model(C.resolve(str(tmp_path / "run")))
    assert back.keys() == mine.keys() and all(torch.equal(back[k], mine[k][:back[k].shape[0]]) for k in back)
