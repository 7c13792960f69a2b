"""`data_prep similar-words`: MacBERT's similar-words file from word vectors (a text vectors file, a Hugging Face model,
a ptm run), checked against a brute-force float64 search, and read back by SimilarWords."""
import numpy as np
import pytest
import torch

from conftest import call_cli
from data_prep import similar
from data_prep.tokenizer import Tokenizer, load_tokenizer
from pretrain.data.masking import SimilarWords

WORDS = [f"w{i}" for i in range(30)] + ["猫", "狗", "鸟"]
PIECES = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", *WORDS, "##s", "##ing"]


def expected(words, vectors, top, min_similarity=-1.0):
    """Each word's `top` nearest other words by cosine, searched in float64: the lines the file must hold."""
    unit = vectors.astype(np.float64) / np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    sims = unit @ unit.T
    np.fill_diagonal(sims, -np.inf)
    lines = []
    for i, w in enumerate(words):
        order = np.argsort(-sims[i])[:top + 1]
        assert (-np.diff(sims[i, order]) > 1e-5).all()  # no near-ties (float32 would order them either way)
        near = [words[j] for j in order[:top] if sims[i, j] >= min_similarity]
        if near:
            lines.append(" ".join([w, *near]))
    return lines


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(similar, "BLOCK", 100)  # 3 rows of 33 a block: the search goes block by block


def test_vectors_file_gives_each_words_nearest_words(tmp_path, small_blocks):
    """A word2vec text file (header, a repeated word: the first kept): --top nearest by cosine, most similar first;
    --min-similarity leaves out the less similar and a word left without any; SimilarWords reads the file."""
    vectors = np.random.default_rng(0).standard_normal((len(WORDS), 6)).astype(np.float32)
    rows = [f"{w} " + " ".join(f"{x:.6f}" for x in v) for w, v in zip(WORDS, vectors)]
    (tmp_path / "vec.txt").write_text(f"{len(WORDS) + 1} 6\n" + "\n".join(rows + ["w3" + " 9" * 6]) + "\n",
                                      encoding="utf-8")
    vectors = np.array([[float(x) for x in r.split()[1:]] for r in rows])  # as written (6 decimals)
    new = tmp_path / "new" / "sim.txt"  # (its directory made, as `build` makes one)
    proc = call_cli("data_prep", "similar-words", tmp_path / "vec.txt", "--out", new, "--top", 3)
    assert f"{len(WORDS)} words" in proc.stdout
    assert new.read_text(encoding="utf-8").splitlines() == expected(WORDS, vectors, 3)
    call_cli("data_prep", "similar-words", tmp_path / "vec.txt", "--out", tmp_path / "sim.txt", "--top", 3,
             "--min-similarity", 0.6)
    lines = (tmp_path / "sim.txt").read_text(encoding="utf-8").splitlines()
    assert lines == expected(WORDS, vectors, 3, 0.6) and 0 < len(lines) < len(WORDS)
    (tmp_path / "vocab.txt").write_text("<UNK>\n" + "\n".join(WORDS) + "\n", encoding="utf-8")
    table = SimilarWords(str(tmp_path / "sim.txt"), Tokenizer("words", str(tmp_path), ["vocab.txt"])).table
    word, *near = lines[0].split()
    read = [int(t[0]) for t in table[(WORDS.index(word) + 1,)]]  # (once per form it reads: text start, after a space)
    assert list(dict.fromkeys(read)) == [WORDS.index(w) + 1 for w in near]


def _vocab(directory, pieces):
    directory.mkdir()
    (directory / "vocab.txt").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    return directory / "vocab.txt"


def test_hf_model_and_ptm_run_give_their_word_pieces_nearest_pieces(tmp_path, small_blocks):
    """A Hugging Face BertModel with its tokenizer, and a ptm run: the words are the vocabulary's whole-word pieces
    (no special token, [unused0] or ##piece), their vectors the input word embeddings; --dataset keeps the words of
    a dataset's vocabulary."""
    from pretrain.models.config import ModelConfig
    from pretrain.parallel import mcore
    from helpers import run_at_init

    transformers = pytest.importorskip("transformers")
    vocab = _vocab(tmp_path / "tok", PIECES)
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(vocab_size=len(PIECES), hidden_size=8, num_hidden_layers=1,
                                                           num_attention_heads=2, intermediate_size=16))
    model.save_pretrained(tmp_path / "hf")
    transformers.BertTokenizerFast.from_pretrained(tmp_path / "tok").save_pretrained(tmp_path / "hf")
    ids = [PIECES.index(w) for w in WORDS]  # not a special token, [unused0] or ##piece
    weight = model.get_input_embeddings().weight.detach().numpy()
    call_cli("data_prep", "similar-words", tmp_path / "hf", "--out", tmp_path / "sim.txt", "--top", 4)
    lines = (tmp_path / "sim.txt").read_text(encoding="utf-8").splitlines()
    assert lines == expected(WORDS, weight[ids], 4)
    assert len(SimilarWords(str(tmp_path / "sim.txt"), load_tokenizer(str(vocab)))) == len(WORDS)

    subset = WORDS[::2]
    _vocab(tmp_path / "data", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *subset])
    call_cli("data_prep", "similar-words", tmp_path / "hf", "--out", tmp_path / "sub.txt", "--top", 2,
             "--dataset", tmp_path / "data")
    assert (tmp_path / "sub.txt").read_text(encoding="utf-8").splitlines() == expected(
        subset, weight[[PIECES.index(w) for w in subset]], 2)

    mcore.initialize(tp=1, seed=0)
    cfg = ModelConfig(arch="bert", vocab_size=len(PIECES), vocab_pad_to=64, hidden_size=8, num_layers=1, num_heads=2,
                      ffn_hidden_size=16, max_position_embeddings=16)
    ours, run = run_at_init(cfg, str(tmp_path / "tok"), tmp_path)
    call_cli("data_prep", "similar-words", run, "--out", tmp_path / "run.txt", "--top", 4)
    assert (tmp_path / "run.txt").read_text(encoding="utf-8").splitlines() == expected(
        WORDS, ours.embeddings.word.weight.detach().numpy()[ids], 4)


@pytest.mark.parametrize("content,says", [
    ("a 1 2 3\nb 1 2\n", "vec.txt:2: 2 numbers after the word, not 3"),
    ("a 1 x 3\n", "vec.txt:1: 'a' is not followed by numbers"),
    (b"\x80\x81 binary", "is not UTF-8 text: a word2vec binary file?"),
])
def test_bad_vectors_file_is_one_clear_line(tmp_path, content, says):
    path = tmp_path / "vec.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    proc = call_cli("data_prep", "similar-words", path, "--out", tmp_path / "sim.txt", check=False)
    assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not (tmp_path / "sim.txt").exists()
