"""Trained and reused tokenizers: ids match the reference implementations, files travel with the data."""
import json
import os
import shutil

import numpy as np
import pytest

from conftest import run_cli, write_jsonl
from data_prep import PrepError
from data_prep.dataset import Corpus
from data_prep.text import TextOptions, normalize
from data_prep.tokenizer import ROLE_PIECES, load_tokenizer
from helpers import quick_build

transformers = pytest.importorskip("transformers", reason="transformers not installed (scripts/setup.sh installs it)")


def test_trained_sentencepiece_has_bert_specials(sp_model, small, tmp_path):
    tok = load_tokenizer(sp_model)
    assert [tok.piece(i) for i in range(6)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]"]
    assert tok.special == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4, "eod": 3}
    m = quick_build([small["path"]], tmp_path / "ds", tokenizer=sp_model)
    assert m["special_ids"] == tok.special and m["vocab_size"] == 3000
    assert m["tokenizer"]["sha256"] == tok.sha256() == load_tokenizer(str(tmp_path / "ds")).sha256()


def test_fast_sentencepiece_offsets_equal_sentencepiece_offset_mapping(sp_model, corpus):
    """The offsets derived from piece lengths must be exactly sentencepiece's own, bytes-fallback included."""
    tok = load_tokenizer(sp_model)
    texts = [s for d in corpus["en"][:200] + corpus["zh"][:300] for s in d.split("\n") if s.strip()]
    texts += ["emoji 🙂 and rare 龘 chars", "tabs\tand  double  spaces", "[MASK] at start"]
    ids, counts, starts, ends = tok.encode(texts)
    at = 0
    for text, n in zip(texts, counts.tolist()):
        ref = tok._encoder.encode(text, out_type="offset_mapping")  # (its [MASK] text: user-defined pieces as control)
        assert ids[at:at + n].tolist() == ref["ids"]
        assert list(zip(starts[at:at + n].tolist(), ends[at:at + n].tolist())) == [tuple(o) for o in ref["offsets"]]
        at += n


SPECIALS_AS_TEXT = ("Web text [MASK] quotes [SEP], [CLS] and [UNK] [PAD] or <|endoftext|> </s> <s> <pad> <unk> <mask> "
                    "<extra_id_0> in a line.")


@pytest.mark.parametrize("tokenizer", ["sp_model", "wordpiece_vocab", "gpt2_vocab", "roberta_vocab", "gpt_vocab",
                                       "t5_json"])
def test_special_pieces_written_in_text_encode_as_the_texts_ordinary_pieces(tokenizer, request, tmp_path):
    """Text is text, whatever the tokenizer's kind (sentencepiece, WordPiece, byte-level BPE, GPT's BPE, a
    tokenizer.json of T5's, whose Unigram model holds </s> <pad> <unk> among its pieces): special pieces written in a
    corpus ([MASK], [SEP], <|endoftext|>, </s>, <extra_id_0> ...) encode to the ids of their ordinary pieces, never to
    a special id (the ends of documents, masks and sentinels are ptm's to place): transformers' ids with
    split_special_tokens where its pipeline keeps them out (a Unigram's reaches them there), and the text decoded back
    where nothing is lost. The special pieces keep their ids, which ptm puts into samples."""
    if tokenizer == "t5_json":
        transformers.T5Tokenizer.from_pretrained(request.getfixturevalue("t5_spiece"), extra_ids=100).save_pretrained(
            tmp_path / "t5")
        path = str(tmp_path / "t5" / "tokenizer.json")
    else:
        path = request.getfixturevalue(tokenizer)
    tok = load_tokenizer(path)
    special = {*tok.special.values(), *tok.sentinel_ids()}
    if tok.kind == "sentencepiece":
        special |= {i for i in range(tok._sp.get_piece_size()) if tok._sp.is_control(i) or tok._sp.is_unknown(i)}
    else:
        special |= {i for i, t in tok.backend().get_added_tokens_decoder().items() if t.special}
    roles = {"sp_model": "mask", "wordpiece_vocab": "mask", "gpt2_vocab": "eod", "roberta_vocab": "mask",
             "gpt_vocab": "eod", "t5_json": "eod"}[tokenizer]
    assert tok.piece(tok.special[roles]) in ROLE_PIECES[roles] and tok.special[roles] in special
    ids = tok.encode([SPECIALS_AS_TEXT])[0].tolist()
    assert not special & set(ids), [tok.piece(i) for i in ids if i in special]
    reference = {"wordpiece_vocab": transformers.BertTokenizer, "gpt2_vocab": transformers.GPT2Tokenizer,
                 "roberta_vocab": transformers.RobertaTokenizerFast, "gpt_vocab": transformers.OpenAIGPTTokenizer}
    if tokenizer in reference:
        ref = reference[tokenizer].from_pretrained(os.path.dirname(path), split_special_tokens=True)
        assert ids == ref(SPECIALS_AS_TEXT, add_special_tokens=False)["input_ids"]
    if tok.kind in ("sentencepiece", "bpe", "tokenizer_json"):
        assert tok.decode(ids) == SPECIALS_AS_TEXT  # (data_prep inspect's view of it)


def test_special_pieces_stay_text_where_a_vocabulary_cannot_spell_them_or_does_not_mark_them(tmp_path):
    """A Unigram vocabulary without "<" (T5's own): the special piece </s> scored below any run of ordinary pieces
    still won where those runs need <unk>; a role's piece added as a token not marked special (a WordPiece [MASK]) was
    matched in text. A tokenizer pickled after it encoded (a spawned worker's) keeps them out too (their pieces are
    renamed: `encode_special_tokens`, which pickling loses, is not all that keeps them out)."""
    import pickle

    from tokenizers import AddedToken, Tokenizer as Pipeline, decoders, models, pre_tokenizers

    unigram = Pipeline(models.Unigram([("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581the", -1.0),
                                       ("\u2581cat", -1.0), ("\u2581", -2.0), *((c, -5.0) for c in "thecas/")], unk_id=2))
    unigram.pre_tokenizer, unigram.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    unigram.add_special_tokens([AddedToken(t, special=True) for t in ("<pad>", "</s>", "<unk>")])
    wordpiece = Pipeline(models.WordPiece({t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                                       "the", "cat", "[", "]", "mask"])},
                                          unk_token="[UNK]"))
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    wordpiece.add_tokens([AddedToken("[MASK]", special=False)])
    for name, pipeline, text, role in (("t5", unigram, "the </s> cat", "eod"), ("bert", wordpiece, "the [MASK] cat",
                                                                                 "mask")):
        (tmp_path / name).mkdir()
        pipeline.save(str(tmp_path / name / "tokenizer.json"))
        assert pipeline.encode(text).ids.count(pipeline.token_to_id(text.split()[1])) == 1  # (what it was)
        tok = load_tokenizer(str(tmp_path / name / "tokenizer.json"))
        for encoder in (tok, pickle.loads(pickle.dumps(tok))):
            ids = encoder.encode([text])[0].tolist()
            assert tok.special[role] not in ids and ids[0] == pipeline.token_to_id("\u2581the" if name == "t5" else "the")


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
    accents = ["Café Noël est naïve", "İstanbul, 한국어"]  # (lower-casing strips accents, as BERT's normalizer does)
    assert [load_tokenizer(gpt_vocab).encode([t])[0].tolist() for t in accents] == [
        ref(t, add_special_tokens=False)["input_ids"] for t in accents]


def test_odd_wordpiece_vocabularies_encode_as_transformers_into_a_valid_dataset(tmp_path):
    """A vocab.txt with a line twice (more ids than pieces), one whose unknown piece is <unk>, and a Chinese BERT's
    (no upper-case piece, and its tokenizer_config.json says do_lower_case false): the ids transformers'
    BertTokenizer gives, in a dataset `verify` passes (a vocabulary size above every id: an embedding row each)."""
    from data_prep.cli import main as prep

    words = ["the", "sum", "of", "two", "numbers", "apple", "##s", "café", "是", "苹", "果", "。", ",", "."]
    texts = ["The sum of two numbers.", "Apples是苹果。", "café, the CAFÉ", "x"]
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in texts])
    for name, unk, lines, lower in (("twice", "[UNK]", words + ["sum"], None), ("unk", "<unk>", words, None),
                                    ("zh", "[UNK]", words, False)):
        vocab = tmp_path / name / "vocab.txt"
        vocab.parent.mkdir()
        vocab.write_text("\n".join(["[PAD]", unk, "[CLS]", "[SEP]", "[MASK]", *lines]) + "\n")
        if lower is not None:
            (tmp_path / name / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}))
        ref = transformers.BertTokenizer.from_pretrained(str(tmp_path / name), unk_token=unk)
        m = quick_build([src], tmp_path / f"ds-{name}", tokenizer=str(vocab), dedup=False, max_unk_rate=1.0)
        c = Corpus(str(tmp_path / f"ds-{name}"))
        assert [c.tokens(i).tolist() for i in range(len(texts))] == [
            ref(t, add_special_tokens=False)["input_ids"] for t in texts]
        assert m["vocab_size"] == 5 + len(lines)
        with pytest.raises(SystemExit) as done:
            prep(["verify", str(tmp_path / f"ds-{name}")])
        assert done.value.code == 0


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


def test_a_tokenizer_json_alone_encodes_as_transformers_with_t5s_sentinels_its_own(sp_model, t5_spiece, corpus,
                                                                                    tmp_path):
    """transformers 5 saves a tokenizer as its tokenizer.json alone (ALBERT's, T5's: Unigram; BERT's, GPT-2's):
    data_prep (the directory or the file) and from-hf encode with that pipeline as transformers does, whole (a length
    the file cuts at is not applied); T5's <extra_id_k> there, <extra_id_0> the last id, are the dataset's sentinels
    (another --sentinels is one line)."""
    from tokenizers import Tokenizer

    from checkpoints_tools.hf import import_tokenizer

    docs = [t for t in corpus["en"][:40] if len(t) > 200] + ["Café ``quoted'' text  with   spaces, ÉTÉ."]
    src = write_jsonl(tmp_path / "d.jsonl", [{"text": t} for t in docs])
    (tmp_path / "src").mkdir()
    shutil.copy(os.path.join(sp_model, "spm.model"), tmp_path / "src" / "spiece.model")  # (the name they read)
    for name, hf in (("albert", transformers.AlbertTokenizer.from_pretrained(tmp_path / "src")),  # (T5's pieces:)
                     ("t5", transformers.T5Tokenizer.from_pretrained(t5_spiece, extra_ids=100))):
        hf.save_pretrained(tmp_path / name)
        assert sorted(os.listdir(tmp_path / name)) == ["tokenizer.json", "tokenizer_config.json"]
        cut = Tokenizer.from_file(str(tmp_path / name / "tokenizer.json"))
        cut.enable_truncation(8)  # (a length saved in the file)
        cut.save(str(tmp_path / name / "tokenizer.json"))
        m = quick_build([src], tmp_path / f"ds-{name}", tokenizer=str(tmp_path / name), dedup=False,
                        text=TextOptions(nfkc=False, whitespace="keep"))
        c = Corpus(str(tmp_path / f"ds-{name}"))
        assert m["tokenizer"]["kind"] == "tokenizer_json" and c.vocab_size == len(hf)
        for i, t in enumerate(docs):
            assert c.tokens(i).tolist() == hf(t, add_special_tokens=False)["input_ids"]
        import_tokenizer(str(tmp_path / name), str(tmp_path / f"imported-{name}"))
        assert load_tokenizer(str(tmp_path / name / "tokenizer.json")).sha256() == \
            load_tokenizer(str(tmp_path / f"imported-{name}")).sha256() == m["tokenizer"]["sha256"]
    assert c.sentinel_ids == hf.convert_tokens_to_ids([f"<extra_id_{k}>" for k in range(100)])
    with pytest.raises(PrepError, match=r"holds 100 sentinels <extra_id_0..99> already, not 5; pass --sentinels 100"):
        quick_build([src], tmp_path / "five", tokenizer=str(tmp_path / "t5"), sentinels=5)


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
