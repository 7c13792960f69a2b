"""One tokenizer interface over sentencepiece models, BERT WordPiece `vocab.txt`, GPT-2 byte-level BPE and word
vocabularies (`words`: bilm-tf's vocabulary file, one word per line; data_prep/words.py builds them).

A dataset keeps its tokenizer in `DIR/tokenizer/`: the original files plus `ptm_tokenizer.json`
(kind, files, lower-casing, an imported tokenizer's text rewriting, special token ids), so training and the Hugging
Face export use exactly the vocabulary the data was encoded with.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import unicodedata
from itertools import chain

import numpy as np

from data_prep import PrepError
from data_prep.text import _structure  # the compiled loops; text.py's import names the fix where they are not built
from ptm.files import copy_file, write_bytes, write_json

META = "ptm_tokenizer.json"
PIPELINE = "hf_tokenizer.json"  # a tokenizer.json's name in ptm's tokenizer directory (an export writes its own)
_WORD = re.compile(r"\S+")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Names that public vocabularies use for the same roles, tried in order.
ROLE_PIECES = {
    "pad": ("[PAD]", "<pad>"),
    "unk": ("[UNK]", "<unk>", "<UNK>"),
    "bos": ("<S>",),
    "cls": ("[CLS]", "<cls>", "<s>"),  # (XLNet's vocabulary has <s> and </s> besides its <cls> and <sep>)
    "sep": ("[SEP]", "<sep>", "</s>"),
    "mask": ("[MASK]", "<mask>"),
    "eod": ("<|endoftext|>", "[EOD]", "<eod>", "</s>", "[SEP]", "</S>"),
}


def role_ids(special: dict, roles, what: str, where: str) -> list[int]:
    """The ids of special `roles` (ROLE_PIECES') in a dataset's `special` ids, refusing in one line a tokenizer
    without one of them (an imported vocabulary: GPT-2's has <|endoftext|> alone)."""
    missing = [r for r in roles if special.get(r) is None]
    if missing:
        names = [f"{r} ({', '.join(ROLE_PIECES[r])})" for r in missing]
        names = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        raise ValueError(f"{where}: its tokenizer has no piece for {names}, needed for {what}; build the dataset "
                         f"with a tokenizer that has {'them' if len(missing) > 1 else 'it'} (`data_prep build` without "
                         f"--tokenizer trains one with every role)")
    return [special[r] for r in roles]


# What a Hugging Face sentencepiece tokenizer (ALBERT's, XLNet's) does to text before its model, in this order (ptm:
# `rewrite`): `` and '' become ", accents are stripped (NFKD, then no nonspacing marks), letters lowercased. Each: the
# normalizer type (and pattern) that names it in a tokenizer.json, and the `tokenizers` normalizers that do it.
REWRITES = {"quotes": ("Replace", "``", lambda n: [n.Replace("``", '"'), n.Replace("''", '"')]),
            "strip_accents": ("StripAccents", None, lambda n: [n.NFKD(), n.StripAccents()]),
            "lowercase": ("Lowercase", None, lambda n: [n.Lowercase()])}


def _unaccented(c: str) -> str:
    return c if c.isascii() else "".join(x for x in unicodedata.normalize("NFKD", c) if unicodedata.category(x) != "Mn")


@functools.cache
def _nonspacing() -> frozenset:
    """The characters of Unicode's category Mn (what StripAccents removes)."""
    return frozenset(chr(c) for c in range(0x300, 0x110000) if unicodedata.category(chr(c)) == "Mn")


def _accent_free(text: str) -> bool:
    """Stripping accents leaves `text` as it is (English, Chinese: no decomposable letter, no mark)."""
    return text.isascii() or unicodedata.is_normalized("NFKD", text) and _nonspacing().isdisjoint(text)


def _lower(text: str) -> str:
    """Each character lowercased alone, as `tokenizers`' Lowercase does (str.lower turns a final Σ into ς)."""
    return text.lower() if "Σ" not in text else "".join(c.lower() for c in text)


def rewrite(text: str, rewrites) -> tuple[str, tuple[np.ndarray, np.ndarray] | None]:
    """`text` rewritten, and where in `text` each of its character boundaries falls: (starts, ends), of the
    characters of `text` that the character at or before each boundary came from (None where every character stays
    one)."""
    lower = _lower if "lowercase" in rewrites else str
    quotes = "quotes" in rewrites and ("``" in text or "''" in text)
    if not quotes and ("strip_accents" not in rewrites or _accent_free(text)) and len(lower(text)) == len(text):
        return lower(text), None
    units = re.findall("``|''|.", text, re.S) if quotes else list(text)
    pieces = [lower('"' if len(u) == 2 else _unaccented(u) if "strip_accents" in rewrites else u) for u in units]
    widths = np.fromiter(map(len, units), dtype=np.int64, count=len(units))
    lengths = [len(p) for p in pieces]  # (İ lowercases to two characters; a lone mark is stripped to none)
    ends = np.cumsum(widths)
    return "".join(pieces), (np.append(np.repeat(ends - widths, lengths), len(text)),
                             np.insert(np.repeat(ends, lengths), 0, 0))


def hf_rewrites(directory: str) -> tuple[str, ...]:
    """The REWRITES of the Hugging Face tokenizer in `directory` (its tokenizer.json's normalizer, or else its
    tokenizer_config.json's do_lower_case and keep_accents); none where it has neither."""
    try:
        with open(os.path.join(directory, "tokenizer.json"), encoding="utf-8") as f:
            found = json.dumps(json.load(f).get("normalizer"))
        return tuple(name for name, (kind, pattern, _) in REWRITES.items()
                     if f'"type": "{kind}"' in found and (pattern is None or json.dumps(pattern) in found))
    except (OSError, ValueError, AttributeError):
        pass
    try:
        with open(os.path.join(directory, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return ()
    return tuple(name for name, on in (("quotes", "keep_accents" in config),  # (ALBERT's, XLNet's: always)
                                       ("strip_accents", config.get("keep_accents") is False),
                                       ("lowercase", config.get("do_lower_case") is True)) if on)


def hf_normalizers(rewrites) -> list:
    """The `tokenizers` normalizers that rewrite text as `rewrites` do (an export's tokenizer.json)."""
    from tokenizers import normalizers

    return [step for name, (_, _, steps) in REWRITES.items() if name in rewrites for step in steps(normalizers)]


class Tokenizer:
    """Encodes text to ids with character offsets; `kind` is sentencepiece, wordpiece, bpe (byte-level: GPT-2's),
    char_bpe (words of characters ending in </w>, split as BERT splits text: GPT's), tokenizer_json (any Hugging Face
    fast tokenizer, as its tokenizer.json defines it, as GPT-NeoX reads one) or words. `sentinels`: T5's
    `<extra_id_k>` ids appended after the vocabulary, `<extra_id_0>` the last (as T5's vocabularies hold them); text
    never encodes to them: span corruption puts them in its samples (`sentinel_ids`). A tokenizer.json holding them
    as its last added tokens (T5's) has them as its sentinels. Text is text: a special piece written in the text
    ("[SEP]", "</s>", "<|endoftext|>", "[MASK]") encodes to its ordinary pieces, never to a special id (`_encoder`;
    the words kind aside: its text is ptm's own, one word a piece, its <S> and </S> the sentences' bounds)."""

    def __init__(self, kind: str, directory: str, files: list[str], lowercase: bool = False, threads: int = 1,
                 sentinels: int = 0, rewrites: tuple[str, ...] = ()):
        self.kind, self.directory, self.files, self.lowercase = kind, directory, files, lowercase
        self.threads, self.sentinels = threads, sentinels
        self.rewrites = tuple(r for r in REWRITES if r in rewrites)  # (sentencepiece: `rewrite`, in its order)
        self._tables = None
        paths = [os.path.join(directory, f) for f in files]
        if kind == "sentencepiece":
            import sentencepiece as spm

            self._sp = spm.SentencePieceProcessor(model_file=paths[0])
            self.vocab_size = self._sp.get_piece_size()
            self._piece = self._sp.id_to_piece
        elif kind == "tokenizer_json":
            from tokenizers import Tokenizer as Pipeline

            self._hf = Pipeline.from_file(paths[0])
            self._hf.no_truncation()  # (a saved tokenizer.json may cut and pad to a model's length)
            self._hf.no_padding()
            self.vocab_size = _id_count(self._hf)
            self._piece = self._hf.id_to_token
            own = _own_sentinels(self._hf, paths[0])
            if own and sentinels not in (0, own):
                raise PrepError(f"{paths[0]} holds {own} sentinels <extra_id_0..{own - 1}> already, not {sentinels}; "
                                f"pass --sentinels {own} or none")
            self.vocab_size, self.sentinels = self.vocab_size - own, sentinels or own
        elif kind == "words":  # one word per line; text is words separated by whitespace
            with open(paths[0], encoding="utf-8") as f:
                self._words = f.read().split("\n")[:-1]
            self._ids = {w: i for i, w in enumerate(self._words)}
            self.vocab_size = len(self._words)
            self._piece = self._words.__getitem__
        else:
            from tokenizers import implementations as impl

            if kind == "wordpiece":
                self._hf = impl.BertWordPieceTokenizer(paths[0], lowercase=lowercase,
                                                       unk_token=_unk_piece(paths[0]) or "[UNK]")
            elif kind == "bpe":
                self._hf = impl.ByteLevelBPETokenizer(paths[0], paths[1])
            elif kind == "char_bpe":
                self._hf = _gpt_bpe(paths[0], paths[1], lowercase)
            else:
                raise PrepError(f"unknown tokenizer kind {kind!r} in {directory}/{META}")
            self.vocab_size = _id_count(self._hf)
            self._piece = self._hf.id_to_token
        self.vocab_size += self.sentinels
        self.special = {role: i for role, names in ROLE_PIECES.items() if (i := self._find(names)) is not None}
        self.special.setdefault("eod", self.special.get("sep"))
        if kind == "words":  # packed windows of words never pad; the end of a sentence stands in
            self.special.setdefault("pad", self.special.get("eod"))

    def sentinel_ids(self) -> list[int]:
        """The id of `<extra_id_k>` at index k."""
        return sentinel_ids(self.vocab_size, self.sentinels)

    def _find(self, pieces) -> int | None:
        for p in pieces:
            i = (self._sp.piece_to_id(p) if self.kind == "sentencepiece" else self._ids.get(p) if self.kind == "words"
                 else self._hf.token_to_id(p))
            if i is not None and self.piece(i) == p:
                return i
        return None

    @functools.cached_property
    def _encoder(self):
        """What encodes text (a sentencepiece processor or a `tokenizers.Tokenizer`): this tokenizer with no special
        piece within the text's reach, so that a corpus cannot forge the ends of documents, masks or sentinels that
        ptm puts between and into its texts (sentencepiece keeps its control pieces as text too, as tiktoken does by
        default). Special: the pieces of `special`'s roles, the sentinels, a tokenizers pipeline's special tokens."""
        ids = {i for i in (*self.special.values(), *self.sentinel_ids()) if i is not None}
        if self.kind == "sentencepiece":
            return _sp_text_only(self._sp, ids)
        return _pipeline_text_only(self.backend(), ids)

    def backend(self):
        """The `tokenizers.Tokenizer` that encodes (wordpiece, bpe, char_bpe, tokenizer_json)."""
        return getattr(self._hf, "_tokenizer", self._hf)  # (`tokenizers.implementations` wrap one)

    @functools.cached_property
    def keeps_leading_space(self) -> bool:
        """A text's leading whitespace is a token of its own (byte-level BPE, as GPT-2's); the others ignore it (read
        once: the encoder asks at every chunk)."""
        if self.kind != "tokenizer_json":
            return self.kind == "bpe"
        return '"ByteLevel"' in json.dumps(json.loads(self._hf.to_str()).get("pre_tokenizer"))

    def piece(self, i: int) -> str:
        if int(i) >= self.vocab_size - self.sentinels:
            return f"<extra_id_{self.vocab_size - 1 - int(i)}>"
        return self._piece(int(i))

    def encode(self, texts: list[str], offsets: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """All texts in one call: token ids (integers, concatenated), tokens per text, and every token's
        character [start, end) in its text (None, None without `offsets`)."""
        if self.kind == "sentencepiece":
            return self._sp_encode(texts, offsets)
        if self.kind == "words":
            return self._words_encode(texts, offsets)
        encs = self._encoder.encode_batch(texts, add_special_tokens=False)
        counts = np.fromiter((len(e.ids) for e in encs), dtype=np.int64, count=len(encs))
        n = int(counts.sum())
        ids = np.fromiter(chain.from_iterable(e.ids for e in encs), dtype=np.int64, count=n)
        if not offsets:
            return ids, counts, None, None
        offs = np.fromiter(chain.from_iterable(chain.from_iterable(e.offsets for e in encs)), dtype=np.int64,
                           count=2 * n).reshape(-1, 2)
        return ids, counts, offs[:, 0], offs[:, 1]

    def _sp_encode(self, texts, offsets: bool):
        """sentencepiece's numpy output is ~8x faster than its offset mapping, so character offsets are
        derived from per-piece lengths (a "▁" is one space, the dummy prefix none, a byte-fallback
        character sits on its last byte) and checked against each text's length; texts where they do not
        add up (unknown pieces, a model that rewrites text) take sentencepiece's own offsets. `rewrites` are
        applied first, offsets mapped back to the text as given."""
        sources = None
        if self.rewrites:
            texts, sources = zip(*(rewrite(t, self.rewrites) for t in texts)) if texts else ((), ())
        arrays = self._encoder.encode(list(texts), out_type="numpy", num_threads=self.threads)
        counts = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
        ids = np.frombuffer(b"".join(arrays), dtype=np.int32)  # int32 arrays: joined as bytes, 4x faster
        if not offsets:
            return ids, counts, None, None
        t = self._sp_tables()
        first = np.cumsum(counts) - counts
        expected = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        starts, ends, bad = _structure.piece_offsets(ids, counts, expected, t["chars"], t["space_first"], t["byte"],
                                                     t["continuation"], t["unknown"], t["dummy_prefix"])
        for i in bad.tolist():
            offs = np.asarray(self._encoder.encode(texts[i], out_type="offset_mapping")["offsets"], dtype=np.int64)
            sl = slice(first[i], first[i] + counts[i])
            starts[sl], ends[sl] = offs[:, 0], offs[:, 1]
        for i, source in enumerate(sources or ()):
            if source is not None:  # a piece ends where the character its last character came from ends
                sl = slice(first[i], first[i] + counts[i])
                begin, end = source[0][starts[sl]], source[1][ends[sl]]
                starts[sl], ends[sl] = begin, np.where(ends[sl] > starts[sl], end, begin)
        return ids, counts, starts, ends

    def _words_encode(self, texts, offsets: bool):
        """Each whitespace-separated word's id (<UNK> for a word outside the vocabulary) and character span."""
        found = [[(m.group(), m.start(), m.end()) for m in _WORD.finditer(t)] for t in texts]
        unk = self.special.get("unk", 0)
        ids = np.fromiter((self._ids.get(w, unk) for ws in found for w, _, _ in ws), dtype=np.int64)
        counts = np.fromiter(map(len, found), dtype=np.int64, count=len(found))
        if not offsets:
            return ids, counts, None, None
        spans = np.array([(a, b) for ws in found for _, a, b in ws], dtype=np.int64).reshape(-1, 2)
        return ids, counts, spans[:, 0], spans[:, 1]

    def _sp_tables(self) -> dict:
        if self._tables is None:
            sp, n = self._sp, self._sp.get_piece_size()  # the model's pieces: sentinels come after them
            pieces = [sp.id_to_piece(i) for i in range(n)]
            byte = np.array([sp.is_byte(i) for i in range(n)], dtype=bool)
            value = np.array([int(p[3:5], 16) if b else 0 for p, b in zip(pieces, byte)])
            self._tables = {  # per piece, for data_prep._structure.piece_offsets
                "chars": np.array([0 if b else len(p) for p, b in zip(pieces, byte)], dtype=np.int64),
                "space_first": np.array([p.startswith("\u2581") for p in pieces], dtype=np.uint8),
                "byte": byte.astype(np.uint8),
                "continuation": (byte & (value >= 0x80) & (value < 0xC0)).astype(np.uint8),
                "unknown": np.array([sp.is_unknown(i) or sp.is_control(i) for i in range(n)], dtype=np.uint8),
                "dummy_prefix": sp.encode("a", out_type=str)[0].startswith("\u2581"),
            }
        return self._tables

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self.kind == "words":
            return " ".join(map(self._piece, ids))
        return self._sp.decode(ids) if self.kind == "sentencepiece" else self._hf.decode(ids, skip_special_tokens=False)

    def sha256(self) -> str:
        h = hashlib.sha256()
        if self.rewrites:  # (another text, other ids)
            h.update(" ".join(self.rewrites).encode())
        for f in sorted(self.files):
            if self.kind != "tokenizer_json":  # (saved as PIPELINE whatever its name)
                h.update(f.encode())
            with open(os.path.join(self.directory, f), "rb") as fh:
                h.update(fh.read())
        return h.hexdigest()

    def meta(self) -> dict:
        return {"kind": self.kind, "files": self.files, "lowercase": self.lowercase,
                "vocab_size": self.vocab_size, "special_ids": self.special, "sentinels": self.sentinels,
                "rewrites": list(self.rewrites), "sha256": self.sha256()}

    def save(self, directory: str) -> "Tokenizer":
        """Copy the tokenizer files and metadata into `directory`; returns the tokenizer loaded from there."""
        os.makedirs(directory, exist_ok=True)
        names = [PIPELINE] if self.kind == "tokenizer_json" else self.files
        for f, name in zip(self.files, names):
            src, dst = os.path.join(self.directory, f), os.path.join(directory, name)
            if os.path.abspath(src) != os.path.abspath(dst):
                copy_file(src, dst)
        saved = Tokenizer(self.kind, directory, names, self.lowercase, self.threads, self.sentinels, self.rewrites)
        write_json(os.path.join(directory, META), saved.meta())
        return saved

    def with_sentinels(self, n: int) -> "Tokenizer":
        """This tokenizer with `n` sentinels after its vocabulary instead of its own."""
        return Tokenizer(self.kind, self.directory, self.files, self.lowercase, self.threads, n, self.rewrites)


def _sp_text_only(sp, ids):
    """`sp`, its user-defined pieces among `ids` (data_prep's [CLS], [SEP], [MASK]: sentencepiece finds user-defined
    pieces in text) made control pieces, which sentencepiece never encodes text to (as its <s> and </s>)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    model = pb.ModelProto.FromString(sp.serialized_model_proto())
    found = [p for i, p in enumerate(model.pieces) if i in ids and p.type == p.USER_DEFINED]
    for p in found:
        p.type = p.CONTROL
    return spm.SentencePieceProcessor(model_proto=model.SerializeToString()) if found else sp


OUT_OF_REACH = "\uffff"  # a Unicode noncharacter (kept for a program's internal use): no text holds it


def _pipeline_text_only(pipeline, ids):
    """A copy of a `tokenizers.Tokenizer` that finds none of `ids` nor of its special tokens in text: their pieces
    renamed out of any text's reach (OUT_OF_REACH before them) in its model's vocabulary (a Unigram's, T5's and
    ALBERT's, holds </s>, <pad>, <extra_id_k> among its pieces, which it would pick for text that spells them) and among
    its added tokens, which are all special then and not matched in text (`encode_special_tokens`): as sentencepiece
    keeps its control pieces out. The ids stay; decoding is the original pipeline's."""
    from tokenizers import Tokenizer as Pipeline

    spec = json.loads(pipeline.to_str())
    added, model = spec.get("added_tokens") or [], spec["model"]
    hidden = ids | {t["id"] for t in added if t.get("special")}
    for token in added:
        if token["id"] in hidden:
            token.update(content=OUT_OF_REACH + token["content"], special=True)
    vocab = model.get("vocab")
    if isinstance(vocab, list):  # Unigram: [piece, score] at each id
        for i in hidden & set(range(len(vocab))):
            vocab[i][0] = OUT_OF_REACH + vocab[i][0]
    elif isinstance(vocab, dict):  # WordPiece, BPE, WordLevel: piece -> id
        renamed = {piece: OUT_OF_REACH + piece for piece, i in vocab.items() if i in hidden}
        model["vocab"] = {renamed.get(piece, piece): i for piece, i in vocab.items()}
        if model.get("unk_token") in renamed:
            model["unk_token"] = renamed[model["unk_token"]]
    text_only = Pipeline.from_str(json.dumps(spec))
    text_only.encode_special_tokens = True
    return text_only


def sentinel_ids(vocab_size: int, sentinels: int) -> list[int]:
    """`<extra_id_k>`'s id at index k: counting down from the vocabulary's last id."""
    return [vocab_size - 1 - k for k in range(sentinels)]


def _vocab_is_uncased(vocab: str) -> bool:
    """No piece of a vocab.txt or vocab.json has an upper-case letter (special pieces aside)."""
    with open(vocab, encoding="utf-8") as f:
        pieces = json.load(f) if vocab.endswith(".json") else f
        return not any(t.strip() != t.strip().lower() and not t.startswith(("[", "<")) for t in pieces)


def _wordpiece_lowercase(vocab_txt: str) -> bool:
    """Whether a WordPiece vocabulary lower-cases text: its tokenizer_config.json's do_lower_case where one is beside
    it (a Chinese BERT's vocabulary has no upper-case piece, and transformers lower-cases nothing), else whether it
    has no upper-case piece."""
    try:
        with open(os.path.join(os.path.dirname(vocab_txt), "tokenizer_config.json"), encoding="utf-8") as f:
            said = json.load(f).get("do_lower_case")
    except (OSError, ValueError, AttributeError):
        said = None
    return said if isinstance(said, bool) else _vocab_is_uncased(vocab_txt)


def _ends_words(vocab_json: str) -> bool:
    """A BPE vocabulary whose pieces end words with </w> (GPT's, tokenizers' CharBPETokenizer), not a byte-level one."""
    with open(vocab_json, encoding="utf-8") as f:
        return any(t.endswith("</w>") for t in json.load(f))


def _unk_piece(vocab: str) -> str | None:
    """The unknown piece ([UNK], <unk> ...) of a vocab.txt or vocab.json."""
    with open(vocab, encoding="utf-8") as f:
        pieces = json.load(f) if vocab.endswith(".json") else set(f.read().splitlines())
    return next((p for p in ROLE_PIECES["unk"] if p in pieces), None)


def _id_count(tok) -> int:
    """One more than a `tokenizers` vocabulary's largest id (a vocab.txt of a line twice, a vocab.json with a gap:
    more ids than pieces)."""
    return max(tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1


def _gpt_bpe(vocab: str, merges: str, lowercase: bool):
    """GPT's BPE as transformers' OpenAIGPTTokenizer builds it: BERT's normalizer (lower-casing strips accents) and
    pre-tokenizer, words of characters ending in </w>, <unk> for a character outside the vocabulary."""
    from tokenizers import Tokenizer as Pipeline
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    unk = _unk_piece(vocab)
    if unk is None:
        raise PrepError(f"{vocab} has no <unk> piece, which GPT's BPE encodes a character outside its vocabulary "
                        "with (as transformers does); add one, or pass another tokenizer")
    tok = Pipeline(models.BPE.from_file(vocab, merges, unk_token=unk, end_of_word_suffix="</w>", fuse_unk=False))
    tok.add_special_tokens([unk])
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    return tok


def load_tokenizer(path: str, threads: int = 1) -> Tokenizer:
    """A sentencepiece `.model`, a WordPiece `vocab.txt`, a BPE `vocab.json` (+ `merges.txt` beside it: GPT-2's
    byte-level or GPT's of words), a Hugging Face `tokenizer.json`, a directory holding one of those (its vocab files
    first), a ptm tokenizer directory, or a ptm dataset directory."""
    if not os.path.exists(path):
        raise PrepError(f"tokenizer not found: {path}; pass a .model, vocab.txt, vocab.json, tokenizer.json or a dataset "
                        "directory")
    if os.path.isdir(path):
        for sub in (path, os.path.join(path, "tokenizer")):
            if os.path.isfile(os.path.join(sub, META)):
                return _opened(os.path.join(sub, META), lambda: _from_meta(sub, threads))
        names = sorted(os.listdir(path))
        models = [n for n in names if n.endswith(".model")]
        for candidate in (*models, "vocab.txt", "vocab.json", "tokenizer.json"):
            if candidate in names:
                return load_tokenizer(os.path.join(path, candidate), threads)
        raise PrepError(f"no tokenizer in {path}: expected a .model, vocab.txt, vocab.json + merges.txt or "
                        "tokenizer.json")
    directory, name = os.path.split(os.path.abspath(path))
    if name.endswith(".model"):
        return _opened(path, lambda: Tokenizer("sentencepiece", directory, [name], threads=threads,
                                               rewrites=hf_rewrites(directory)))
    if name.endswith(".txt"):
        return _opened(path, lambda: Tokenizer("wordpiece", directory, [name], lowercase=_wordpiece_lowercase(path),
                                               threads=threads))
    if name.endswith(".json") and _opened(path, lambda: _is_pipeline(path)):
        return _opened(path, lambda: Tokenizer("tokenizer_json", directory, [name], threads=threads))
    if name.endswith(".json"):
        if not os.path.isfile(os.path.join(directory, "merges.txt")):
            raise PrepError(f"BPE vocabulary {path} needs merges.txt beside it")
        words = _opened(path, lambda: _ends_words(path))
        return _opened(path, lambda: Tokenizer("char_bpe" if words else "bpe", directory, [name, "merges.txt"],
                                               lowercase=words and _vocab_is_uncased(path), threads=threads))
    raise PrepError(f"cannot tell what tokenizer {path} is; pass a .model, vocab.txt, vocab.json or tokenizer.json")


def _is_pipeline(path: str) -> bool:
    """A tokenizer.json (a pipeline: normalizer, pre-tokenizer, model ...), not a BPE vocab.json."""
    with open(path, encoding="utf-8") as f:
        return isinstance(json.load(f).get("model"), dict)


def _own_sentinels(pipeline, path: str) -> int:
    """How many of T5's `<extra_id_k>` a tokenizer.json holds, as ptm numbers sentinels (<extra_id_0> the last id)."""
    vocab = pipeline.get_vocab(with_added_tokens=True)
    found = sorted(int(t[10:-1]) for t in vocab if t.startswith("<extra_id_") and t.endswith(">") and t[10:-1].isdigit())
    last = pipeline.get_vocab_size(with_added_tokens=True) - 1
    if found != list(range(len(found))) or any(vocab[f"<extra_id_{k}>"] != last - k for k in found):
        raise PrepError(f"{path} holds <extra_id_k> pieces numbered otherwise than T5's (<extra_id_0> the last id, "
                        "<extra_id_1> the one before, ...), as ptm numbers sentinels; pass a tokenizer without them")
    return len(found)


def _from_meta(directory: str, threads: int) -> Tokenizer:
    with open(os.path.join(directory, META)) as f:
        m = json.load(f)
    return Tokenizer(m["kind"], directory, m["files"], m["lowercase"], threads, m.get("sentinels", 0),
                     m.get("rewrites", ()))


def _opened(path: str, make) -> Tokenizer:
    """`make()`, a tokenizer file that does not load (truncated, another format) a PrepError naming `path`."""
    try:
        return make()
    except PrepError:
        raise
    except Exception as e:  # sentencepiece's RuntimeError, tokenizers' Exception, JSON, a missing or binary file
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PrepError(f"{path}: the tokenizer does not load ({reason}); it is truncated or not a tokenizer file: "
                        "copy or rebuild it, or pass another tokenizer") from None


def train_sentencepiece(sentences: list[str], directory: str, *, vocab_size: int, model_type: str,
                        num_unused: int, threads: int) -> Tokenizer:
    """Train a sentencepiece model with BERT's special tokens at ids 0-4 and `[unusedN]` after them."""
    import sentencepiece as spm

    if not sentences:
        raise PrepError("no text to train a tokenizer on; check the inputs and filters")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size, model_type=model_type,
            pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece="[PAD]", unk_piece="[UNK]",
            user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"] + [f"[unused{i}]" for i in range(num_unused)],
            byte_fallback=True, character_coverage=0.9995, normalization_rule_name="identity",
            split_digits=True, max_sentence_length=1 << 16, input_sentence_size=0,
            num_threads=threads, minloglevel=2,
        )
    except RuntimeError as e:  # "INTERNAL: src/FILE.cc(LINE) [CHECK] What went wrong. What sentencepiece advises."
        reason = re.sub(r"^[A-Z_]+: \S+\(\d+\) \[.*?\] ", "", str(e).strip().splitlines()[-1])
        chars = re.search(r"smaller than required_chars\. \d+ vs (\d+)", reason)
        if chars:  # (its advice, to lower --character_coverage, names no option of data_prep's)
            raise PrepError(f"--vocab-size {vocab_size} is below the {chars[1]} pieces this corpus needs at least (a "
                            "piece per character, 256 byte-fallback pieces and the special tokens); raise it") from None
        raise PrepError(f"cannot train a {vocab_size}-piece {model_type} tokenizer on this corpus ({reason}); change "
                        "--vocab-size") from None
    os.makedirs(directory, exist_ok=True)
    write_bytes(os.path.join(directory, "spm.model"), model.getvalue())
    return Tokenizer("sentencepiece", directory, ["spm.model"], threads=threads).save(directory)


BYTE_BPE_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # RoBERTa's, at ids 0-4


def train_byte_bpe(sentences: list[str], directory: str, *, vocab_size: int, threads: int) -> Tokenizer:
    """Train a byte-level BPE (GPT-2/RoBERTa: vocab.json + merges.txt, no unknown pieces) with RoBERTa's special
    tokens at ids 0-4, using Hugging Face tokenizers."""
    from tokenizers import ByteLevelBPETokenizer

    if not sentences:
        raise PrepError("no text to train a tokenizer on; check the inputs and filters")
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(sentences, vocab_size=vocab_size, special_tokens=list(BYTE_BPE_SPECIALS), show_progress=False)
    if bpe.get_vocab_size() < vocab_size:
        raise PrepError(f"the corpus yields {bpe.get_vocab_size()} byte-level BPE pieces, fewer than --vocab-size "
                        f"{vocab_size}; lower --vocab-size or give more text")
    os.makedirs(directory, exist_ok=True)
    bpe.save_model(directory)
    return Tokenizer("bpe", directory, ["vocab.json", "merges.txt"], threads=threads).save(directory)
