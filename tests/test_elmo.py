"""ELMo: character ids as bilm-tf and AllenNLP make them; the word dataset (`data_prep words`); the model against a
float64 reference of the published equations (TF's layouts, gate order and run-time forget bias) computed from the
exported weights.hdf5, read with h5py as the format documents it; the import back bit-exact; training end to end,
with the export and import on the CLI."""
import json
import os

import numpy as np
import pytest
import torch

import h5py  # a dependency (ELMo's weights.hdf5): missing, the tests fail rather than skip


def test_character_ids_are_bilm_tfs():
    """begin-of-word, the UTF-8 bytes (at most 48), end-of-word, padding to 50, each + 1; <S> and </S> are the
    sentence characters between the word marks."""
    from pretrain.data.char_words import char_ids

    def raw(word):
        return (char_ids(word) - 1).tolist()

    assert raw("th") == [258, 116, 104, 259] + [260] * 46
    assert raw("<S>")[:4] == [258, 256, 259, 260] and raw("</S>")[:4] == [258, 257, 259, 260]
    long = "é" * 30  # 60 bytes: the first 48 kept
    assert raw(long) == [258, *long.encode()[:48], 259]
    assert raw("中") == [258, 228, 184, 173, 259] + [260] * 45


def test_the_word_dataset_holds_the_datasets_words_sentence_by_sentence(train_data, words_data, monkeypatch):
    """Each document is its sentences as `<S> words </S>` (the last `</S>` is the end-of-document token packing adds),
    a word being a run of tokens from one word start to the next; the vocabulary starts <S>, </S>, <UNK>, then the
    words by descending count, with the counts beside it. The same build again is a no-op (it once named temporary
    inputs as "other inputs" and refused), and loads the source's tokenizer once (it once did per document: 25 of
    32 s on the demo's data); the manifest's source, the words' staged text (removed), says what it came from."""
    from data_prep.dataset import Corpus
    from data_prep.words import build_words, sentences, word_counts

    source, words = Corpus(train_data), Corpus(words_data)
    tok = words.tokenizer()
    assert tok.kind == "words" and [tok.piece(i) for i in range(3)] == ["<S>", "</S>", "<UNK>"]
    cache = {}
    for i in (0, 1, len(source) - 1):
        expected = " </S> ".join("<S> " + " ".join(s) for s in sentences(source, i, cache, source.tokenizer()))
        assert tok.decode(words.tokens(i)) == expected
    counts = word_counts(os.path.join(words_data, "tokenizer"))
    assert len(counts) == tok.vocab_size and (np.diff(counts[3:]) <= 0).all()
    seen = np.bincount(np.concatenate([words.tokens(i) for i in range(len(words))]), minlength=tok.vocab_size)
    assert (seen[3:] == counts[3:]).all() and seen[0] == counts[0] == counts[1] == seen[1] + len(words)
    loads = []
    monkeypatch.setattr(Corpus, "tokenizer", lambda self, real=Corpus.tokenizer: loads.append(1) or real(self))
    assert build_words(train_data, words_data, progress=False) == words.manifest
    assert len(loads) == 1
    assert os.listdir(os.path.dirname(words_data)) == ["words"]  # nothing left beside it
    from data_prep.inspect import inspect  # the removed staged text names the dataset it came from
    (staged,) = words.manifest["sources"]
    assert not os.path.exists(staged["path"]) and staged["origin"].startswith(f"the words of {train_data} (")
    assert f"from {staged['path']} (the words of {train_data} (--min-count 1)" in inspect(words_data)
    from pretrain.config import load
    from pretrain.data.factory import build_sources

    # an objective that reads tokens refuses the words (GPT-3 once trained on them; its to-hf failed in protobuf)
    for preset in ("gpt3-tiny", "bart-tiny"):
        with pytest.raises(ValueError, match="holds words .* reads tokens: set data.path to a dataset of "):
            build_sources(load(preset, [f"data.path={words_data}"]))


def _reference(options: dict, w: dict, chars: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
    """bilm-tf's equations in float64 on its own layouts: the char CNN (valid convolutions, max over positions, then
    the activation), highways t * relu(x W_transform + b) + (1 - t) * x with t = sigmoid(x W_carry + b), the projection;
    per direction TF's LSTMCell with num_proj: [x, m] W_0 + B split i, j, f, o, c = sigmoid(f + 1) c + sigmoid(i)
    tanh(j) clipped, m = (sigmoid(o) tanh(c)) W_P_0 clipped; residuals from the second layer; the backward LM on each
    row reversed over its length. Returns [e|e, f1|b1, ...] per row, [length, 2P] each."""
    def sigmoid(x):
        return 1 / (1 + np.exp(-x))

    lstm, cnn = options["lstm"], options["char_cnn"]
    table = np.concatenate([np.zeros((1, cnn["embedding"]["dim"])), w["char_embed"]])
    out = []
    for row, n in zip(chars, lengths):
        x = table[row[:n]]  # [n, 50, E]
        pooled = []
        for i, (width, _) in enumerate(cnn["filters"]):
            kernel, bias = w[f"CNN/W_cnn_{i}"][0], w[f"CNN/b_cnn_{i}"]  # [width, E, filters]
            conv = np.stack([np.einsum("nke,kef->nf", x[:, t:t + width], kernel) for t in range(50 - width + 1)], 1)
            pooled.append(np.maximum((conv + bias).max(1), 0) if cnn["activation"] == "relu"
                          else np.tanh((conv + bias).max(1)))
        h = np.concatenate(pooled, -1)
        for k in range(cnn["n_highway"]):
            t = sigmoid(h @ w[f"CNN_high_{k}/W_carry"] + w[f"CNN_high_{k}/b_carry"])
            h = t * np.maximum(h @ w[f"CNN_high_{k}/W_transform"] + w[f"CNN_high_{k}/b_transform"], 0) + (1 - t) * h
        e = h @ w["CNN_proj/W_proj"] + w["CNN_proj/b_proj"]
        layers = [np.concatenate([e, e], -1)]
        states = [e, e[::-1]]
        for layer in range(lstm["n_layers"]):
            outs = []
            for d in (0, 1):
                at = f"RNN_{d}/RNN/MultiRNNCell/Cell{layer}/LSTMCell/"
                c, m, seq = np.zeros(lstm["dim"]), np.zeros(lstm["projection_dim"]), []
                for x_t in states[d]:
                    i, j, f, o = np.split(np.concatenate([x_t, m]) @ w[at + "W_0"] + w[at + "B"], 4)
                    c = np.clip(sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(j), -lstm["cell_clip"], lstm["cell_clip"])
                    m = np.clip((sigmoid(o) * np.tanh(c)) @ w[at + "W_P_0"], -lstm["proj_clip"], lstm["proj_clip"])
                    seq.append(m)
                seq = np.stack(seq) + (states[d] if layer else 0)
                outs.append(seq)
            states = outs
            layers.append(np.concatenate([outs[0], outs[1][::-1]], -1))
        out.append(layers)
    return out


def _model(**changes):
    from pretrain.config import load
    from pretrain.models.char_bilm import ELMo
    from pretrain.parallel import mcore

    m = load("elmo-tiny").model
    m.vocab_size, m.hidden_dropout = 50, 0.0
    for k, v in changes.items():
        setattr(m, k, v)
    torch.manual_seed(0)
    model = ELMo(m, tp=mcore.OneRank()).eval()
    with torch.no_grad():
        for p in model.parameters():  # every weight and bias drawn, kept to float32 values (the file's dtype)
            p.copy_(torch.randn_like(p) * 0.4)
        model.chars.embedding.weight[0] = 0  # the padding word's
    return m, model


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_layers_match_a_float64_reference_of_the_published_equations_read_from_the_export(activation, tmp_path):
    """ptm's layers (float64) on a padded batch (a short row, padding words all zeros) equal the reference within
    1e-6 on every real position (measured: 1e-15), with the cell and projection clips reached; the reference's
    weights are read from the weights.hdf5 ptm writes (h5py), so the TF layouts are what AllenNLP loads; the
    import gives back every tensor bit for bit."""
    from checkpoints_tools.bilm_tf import from_files, to_files

    cfg, model = _model(activation=activation, cell_clip=1.5, proj_clip=0.8)
    options, weights = to_files(model.state_dict(), cfg)
    with h5py.File(tmp_path / "weights.hdf5", "w") as f:
        for name, array in weights.items():
            f.create_dataset(name, data=array)
    with h5py.File(tmp_path / "weights.hdf5", "r") as f:
        read = {}
        f.visititems(lambda name, node: read.__setitem__(name, node[()].astype(np.float64))
                     if isinstance(node, h5py.Dataset) else None)
    assert read["char_embed"].shape == (261, cfg.char_embedding_size)
    assert read["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"].shape == (2 * cfg.hidden_size, 4 * cfg.ffn_hidden_size)
    g = torch.Generator().manual_seed(1)
    chars = torch.randint(1, 262, (2, 7, 50), generator=g)
    lengths = [7, 4]
    chars[1, 4:] = 0
    ref = _reference(json.loads(json.dumps(options)), read, chars.numpy(), lengths)
    with torch.no_grad():
        ours = [x.numpy() for x in model.double().layers(chars, torch.tensor(lengths))]
    clipped = False
    for b, n in enumerate(lengths):
        for layer, expected in enumerate(ref[b]):
            assert np.abs(ours[layer][b, :n] - expected).max() < 1e-6, (b, layer)
            clipped |= bool(np.isclose(np.abs(expected[:, :cfg.hidden_size]), cfg.proj_clip).any())
    assert clipped
    _, state, missing = from_files(options, weights)
    theirs = {k: v.float()[:cfg.vocab_size] if k.startswith("softmax.") else v.float()
              for k, v in model.state_dict().items()}
    assert not missing and state.keys() == theirs.keys()
    assert all(torch.equal(state[k], theirs[k]) for k in state), [k for k in state if not torch.equal(state[k], theirs[k])]
    published = {k: v for k, v in weights.items() if not k.startswith("softmax/")}  # bilm-tf's files: no softmax
    _, state, missing = from_files(options, published)
    assert missing == ["softmax.weight", "softmax.bias"] and state["softmax.weight"].shape == (cfg.vocab_size, 64)


def test_training_exports_and_imports_elmo_files(words_data, tmp_path):
    """Train a few steps (TP 1); `ptm convert to-elmo` writes options.json, weights.hdf5 and the vocabulary; `from-elmo`
    reads them back into a checkpoint whose weights equal the run's, and training continues from it."""
    from conftest import call_cli, run_cli

    from pretrain import checkpoint as C

    run = tmp_path / "run"
    common = [f"data.path={words_data}", "data.seq_len=16", "train.global_batch_size=8", "train.micro_batch_size=4",
              "optimizer.warmup_steps=1", "train.eval_interval=0", "data.num_workers=0", "train.log_interval=1",
              "data.valid_fraction=0.05"]
    run_cli("pretrain", "train", "--config", "elmo-tiny", "--set", *common, f"out_dir={run}", "train.steps=3")
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert {"fwd_loss", "bwd_loss", "fwd_unigram_loss", "bwd_unigram_loss"} <= rows[0].keys()
    call_cli("checkpoints_tools", "to-elmo", str(run), "--out", str(tmp_path / "elmo"))
    assert sorted(os.listdir(tmp_path / "elmo")) == ["counts.tsv", "options.json", "ptm_tokenizer.json", "vocab.txt",
                                                      "weights.hdf5"]
    call_cli("checkpoints_tools", "from-elmo", str(tmp_path / "elmo"), "--out", str(tmp_path / "imported"))
    a, b = C.load_full_model(C.resolve(str(run))), C.load_full_model(str(tmp_path / "imported"))
    vocab = C.model_config(C.read_meta(C.resolve(str(run)))).vocab_size
    for k in a:
        rows_ = vocab if k.startswith("softmax.") else len(a[k])
        assert torch.equal(a[k][:rows_], b[k][:rows_]), k
    run_cli("pretrain", "train", "--config", "elmo-tiny", "--set", *common, f"out_dir={tmp_path / 'more'}",
            "train.steps=2", f"checkpoint.init_from={tmp_path / 'imported'}")
    assert (tmp_path / "more" / "metrics.jsonl").exists()
    # downstream: the run and its export give the same layers; the mix starts as their mean and learns, the biLM not
    from pretrain.elmo_vectors import ELMoEmbedder

    sentences = [["Return", "the", "value", "."], ["中文"]]
    ours, exported = ELMoEmbedder.load(str(run)), ELMoEmbedder.load(str(tmp_path / "elmo"))
    out, again = ours(sentences), exported(sentences)
    assert all(torch.equal(x, y) for x, y in zip(out["layers"], again["layers"])) and len(out["layers"]) == 3
    assert out["mask"].tolist() == [[True] * 4, [True, False, False, False]]
    torch.testing.assert_close(out["elmo"][0], sum(out["layers"]) / 3)
    out["elmo"][0].square().sum().backward()
    assert ours.mixes[0].weights.grad is not None and all(p.grad is None for p in ours.bilm.parameters())
    shown = run_cli("pretrain", "elmo", str(tmp_path / "elmo"), "--text", "Return the value .").stdout
    assert "layer 2" in shown and "mix" in shown and len(shown.splitlines()) == 5


def test_plan_counts_elmo_as_built_and_as_published():
    """`ptm plan`'s parameters equal the built model's and, for elmo-original without its softmax, the published
    93.6M (93,600,864); its FLOPs are three times the forward pass's matmuls and convolutions (torch's counter) on a
    window of seq_len + 1 words with seq_len predicted in each direction."""
    from torch.utils.flop_counter import FlopCounterMode

    from pretrain import cost
    from pretrain.config import load
    from pretrain.models.char_bilm import ELMo
    from pretrain.parallel import mcore

    original = load("elmo-original", ["model.vocab_size=793471"]).model
    assert cost.count_parameters(original) - original.padded_vocab * 513 == 93_600_864
    cfg = load("elmo-tiny", ["model.vocab_size=1000", "data.seq_len=12"])
    model = ELMo(cfg.model, tp=mcore.OneRank())
    assert cost.count_parameters(cfg.model) == sum(p.numel() for p in model.parameters())
    chars = torch.randint(1, 262, (1, 13, 50))
    with FlopCounterMode(display=False) as counter:
        out = model(chars)
        model.softmax(torch.cat([out["forward"][:, :-1], out["backward"][:, 1:]]))
    assert cost.flops_per_sample(cfg) == 3 * counter.get_total_flops()


def test_the_kernels_line_names_no_attention_for_elmo():
    """ELMo's model attends nowhere: the training log's `kernels:` line says so instead of naming an SDPA kernel."""
    from pretrain import kernels as K
    from pretrain.config import load
    from pretrain.optim import Lamb

    cfg = load("elmo-tiny", ["data.path=none", "model.vocab_size=100"])
    line = K.describe(cfg, "eager", False, Lamb([torch.zeros(1)]), torch.device("cpu"))
    assert "; attention none (ELMo: character CNN, forward and backward LSTM LMs with one softmax); " in line
    assert "SDPA" not in line
