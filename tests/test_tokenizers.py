"""Trained and reused tokenizers: ids match the reference implementations, files travel with the data."""
import os

import numpy as np
import pytest

from conftest import run_cli, write_jsonl
from data_prep import PrepError
from data_prep.dataset import Corpus
from data_prep.text import TextOptions, normalize
from data_prep.tokenizer import load_tokenizer
from helpers import quick_build

transformers = pytest.importorskip("transformers", reason="transformers not installed (scripts/setup.sh installs it)")


def test_trained_sentencepiece_has_bert_specials(sp_model, small, tmp_path):
    tok = load_tokenizer(sp_model)
    assert [tok.piece(i) for i in range(6)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]"]
    assert tok.special == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4, "eod": 3}
    m = quick_build([small["path"]], tmp_path / "ds", tokenizer=sp_model)
    assert m["special_ids"] == tok.special and m["vocab_size"] == 3000
    assert m["tokenizer"]["sha256"] == tok.sha256() == load_tokenizer(str(tmp_path / "ds")).sha256()
    # user-defined specials are single tokens in text, as fill-mask needs
    ids, counts, _, _ = tok.encode(["The [MASK] sat."])
    assert 4 in ids.tolist() and counts.tolist() == [len(ids)]


def test_fast_sentencepiece_offsets_equal_sentencepiece_offset_mapping(sp_model, corpus):
    """The offsets derived from piece lengths must be exactly sentencepiece's own, bytes-fallback included."""
    tok = load_tokenizer(sp_model)
    texts = [s for d in corpus["en"][:200] + corpus["zh"][:300] for s in d.split("\n") if s.strip()]
    texts += ["emoji 🙂 and rare 龘 chars", "tabs\tand  double  spaces", "[MASK] at start"]
    ids, counts, starts, ends = tok.encode(texts)
    at = 0
    for text, n in zip(texts, counts.tolist()):
        ref = tok._sp.encode(text, out_type="offset_mapping")
        assert ids[at:at + n].tolist() == ref["ids"]
        assert list(zip(starts[at:at + n].tolist(), ends[at:at + n].tolist())) == [tuple(o) for o in ref["offsets"]]
        at += n


def test_wordpiece_vocab_matches_transformers(wordpiece_vocab, corpus, tmp_path):
    docs = corpus["en"][:60]
    src = write_jsonl(tmp_path / "en.jsonl", [{"text": t} for t in docs])
    m = quick_build([src], tmp_path / "ds", tokenizer=wordpiece_vocab, dedup=False)
    assert m["tokenizer"]["kind"] == "wordpiece" and m["tokenizer"]["lowercase"] is True
    ref = transformers.BertTokenizer.from_pretrained(os.path.dirname(wordpiece_vocab), do_lower_case=True)
    c = Corpus(str(tmp_path / "ds"))
    assert len(c) == len(docs)
    for i, t in enumerate(docs):
        expected = ref(normalize(t, TextOptions()), add_special_tokens=False)["input_ids"]
        assert c.tokens(i).tolist() == expected
    assert os.path.isfile(tmp_path / "ds" / "tokenizer" / "vocab.txt")
    assert m["special_ids"]["mask"] == ref.mask_token_id


def test_gpt2_bpe_matches_transformers_and_round_trips(gpt2_vocab, corpus, tmp_path):
    docs = corpus["en"][:60]
    src = write_jsonl(tmp_path / "en.jsonl", [{"text": t} for t in docs])
    m = quick_build([src], tmp_path / "ds", tokenizer=gpt2_vocab, dedup=False,
                    text=TextOptions(nfkc=False, whitespace="keep"))
    assert m["tokenizer"]["kind"] == "bpe" and m["special_ids"]["eod"] == load_tokenizer(gpt2_vocab).special["eod"]
    ref = transformers.GPT2Tokenizer.from_pretrained(os.path.dirname(gpt2_vocab))
    c = Corpus(str(tmp_path / "ds"))
    for i, t in enumerate(docs):
        ids = c.tokens(i).tolist()
        assert ids == ref(t.strip())["input_ids"]
        assert ref.decode(ids) == t.strip()  # byte-level: nothing lost, whitespace included


def test_gpts_bpe_of_words_is_not_taken_for_gpt2s_and_encodes_as_transformers(gpt_vocab, corpus, tmp_path):
    """GPT's (2018) vocab.json + merges.txt (pieces ending words in </w>) encodes as transformers' OpenAIGPTTokenizer
    does (lower-cased, split as BERT splits text), not as a byte-level BPE, which dropped what its vocabulary lacks
    ("Construct" became "onstruct") and glued words together."""
    docs = corpus["en"][:60]
    src = write_jsonl(tmp_path / "en.jsonl", [{"text": t} for t in docs])
    m = quick_build([src], tmp_path / "ds", tokenizer=gpt_vocab, dedup=False, text=TextOptions(nfkc=False))
    assert m["tokenizer"]["kind"] == "char_bpe" and m["tokenizer"]["lowercase"]
    ref = transformers.OpenAIGPTTokenizer.from_pretrained(os.path.dirname(gpt_vocab))
    c = Corpus(str(tmp_path / "ds"))
    for i, t in enumerate(docs):
        assert c.tokens(i).tolist() == ref(t, add_special_tokens=False)["input_ids"]
    assert load_tokenizer(gpt_vocab).decode(ref("Construct a Frame")["input_ids"]) == "construct a frame"


def test_word_starts_and_spans_decode_to_words_and_entities(sp_model, tmp_path):
    docs = ["The quick brown fox visited New York City and Paris yesterday.",
            "李白和杜甫都是唐代诗人。他们在长安相识。"]
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in docs])
    (tmp_path / "entities.txt").write_text("New York City\nParis\n李白\n杜甫\n长安\n", encoding="utf-8")
    quick_build([src], tmp_path / "ds", tokenizer=sp_model, entities=str(tmp_path / "entities.txt"))
    c, tok = Corpus(str(tmp_path / "ds")), load_tokenizer(str(tmp_path / "ds"))
    ids = c.tokens(0)
    starts = np.flatnonzero(c.word_start(0)).tolist() + [len(ids)]
    words = [tok.decode(ids[a:b]).strip() for a, b in zip(starts[:-1], starts[1:])]
    assert words == "The quick brown fox visited New York City and Paris yesterday .".split()
    assert [tok.decode(ids[a:b]).strip() for a, b in c.entity_spans(0)] == ["New York City", "Paris"]
    # runs of content words, cut into pieces of at most 4 words
    assert [tok.decode(ids[a:b]).strip() for a, b in c.phrase_spans(0)] == [
        "quick brown fox visited", "New York City", "Paris yesterday"]
    zh = c.tokens(1)
    assert [tok.decode(zh[a:b]) for a, b in c.entity_spans(1)] == ["李白", "杜甫", "长安"]
    assert c.sentence_starts(1).tolist()[0] == 0 and len(c.sentence_starts(1)) == 2


def test_tokenizer_that_does_not_fit_the_text_is_refused(wordpiece_vocab, corpus, tmp_path):
    src = write_jsonl(tmp_path / "zh.jsonl", [{"text": t} for t in corpus["zh"][:50]])
    proc = run_cli("data_prep", "build", src, "--out", tmp_path / "ds", "--tokenizer", wordpiece_vocab, check=False)
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert "[UNK]" in line and "does not fit" in line and "wordpiece" in line


def test_too_large_vocab_is_a_clear_error(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": "tiny corpus with few words."}])
    with pytest.raises(PrepError, match="--vocab-size"):
        quick_build([src], tmp_path / "ds", vocab_size=50000)


def test_unigram_tokenizer_json_without_its_model_names_the_file_and_the_fix(tmp_path):
    """transformers 5 saves a sentencepiece tokenizer (T5's, ALBERT's, XLNet's) as a Unigram tokenizer.json alone:
    data_prep (a directory or the file itself) and from-hf name that file and the .model to copy beside it."""
    from tokenizers import Tokenizer, models

    from checkpoints_tools.hf import import_tokenizer
    from pretrain.checkpoint import CheckpointError

    hf = tmp_path / "hf"
    hf.mkdir()
    unigram = models.Unigram([("<unk>", 0.0), ("\u2581a", -1.0), ("b", -2.0)], unk_id=0)
    Tokenizer(unigram).save(str(hf / "tokenizer.json"))
    says = (f"{hf / 'tokenizer.json'} is a sentencepiece (Unigram) tokenizer without its sentencepiece model, which "
            f"ptm reads: copy the model's .model file (e.g. spiece.model, as released) into {hf}")
    for path in (hf, hf / "tokenizer.json"):
        with pytest.raises(PrepError) as e:
            load_tokenizer(str(path))
        assert str(e.value) == says
    with pytest.raises(CheckpointError) as e:
        import_tokenizer(str(hf), str(tmp_path / "out"))
    assert str(e.value) == says
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": "a b"}])
    proc = run_cli("data_prep", "build", src, "--out", tmp_path / "ds", "--tokenizer", hf, check=False)
    assert proc.returncode == 2 and proc.stderr == f"data_prep: error: {says}\n"


def test_byte_level_bpe_trained_by_data_prep_has_roberta_specials(corpus, tmp_path):
    """`--model-type byte_bpe`: RoBERTa's specials at ids 0-4 (padding 1), every text encoded without unknowns and
    decoded back exactly, and transformers' RoBERTa tokenizer gives the same ids."""
    docs = corpus["en"][:200]
    src = write_jsonl(tmp_path / "en.jsonl", [{"text": t} for t in docs])
    m = quick_build([src], tmp_path / "ds", model_type="byte_bpe", vocab_size=800, dedup=False,
                    text=TextOptions(nfkc=False, whitespace="keep"))
    assert m["tokenizer"]["kind"] == "bpe"
    assert {k: m["special_ids"][k] for k in ("cls", "pad", "sep", "unk", "mask")} == dict(cls=0, pad=1, sep=2, unk=3,
                                                                                         mask=4)
    ref = transformers.RobertaTokenizerFast.from_pretrained(str(tmp_path / "ds" / "tokenizer"))
    c = Corpus(str(tmp_path / "ds"))
    for i, t in enumerate(docs[:50]):
        ids = c.tokens(i).tolist()
        assert ids == ref(t.strip(), add_special_tokens=False)["input_ids"] and 3 not in ids
        assert ref.decode(ids) == t.strip()


def test_text_rewriting_of_an_imported_tokenizer_is_transformers_and_maps_back_to_the_text():
    """ALBERT's and XLNet's rewriting (`` and '' to ", accents stripped, lowercase) gives the text that the
    `tokenizers` normalizers of the export give (a final Σ lowercases to σ alone, as there), and every rewritten
    character maps back to the characters it came from: a ligature's or a Hangul syllable's parts to the whole."""
    from tokenizers import normalizers

    from data_prep.tokenizer import hf_normalizers, rewrite

    texts = ["Crème ΟΔΟΣ ``x'' İy ﬁne.", "한국 Ångström", "plain ascii", "``''", "", "e\u0301 naïve"]
    for rewrites in (("quotes", "strip_accents", "lowercase"), ("lowercase",), ("quotes", "strip_accents")):
        reference = normalizers.Sequence(hf_normalizers(rewrites))
        for text in texts:
            out, source = rewrite(text, rewrites)
            assert out == reference.normalize_str(text), (text, rewrites)
            starts, ends = source if source else (np.arange(len(out) + 1),) * 2
            assert len(starts) == len(ends) == len(out) + 1 and ends[-1] == len(text)
            assert all(text[starts[j]:ends[j + 1]] for j in range(len(out)))  # each character: a non-empty origin
    out, (starts, ends) = rewrite("한", ("strip_accents",))
    assert len(out) == 3 and [(int(starts[j]), int(ends[j + 1])) for j in range(3)] == [(0, 1)] * 3
