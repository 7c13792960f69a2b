"""MacBERT's similar-words file (`data.similar_words`) from word vectors: each word's nearest words by cosine.

    python -m data_prep similar-words VECTORS --out similar.txt [--top 5] [--min-similarity S] [--dataset DATA]

VECTORS is a word2vec or fastText text file (`word v1 v2 ...` a line, with or without the `count dim` header line), or
a model whose input word embeddings give the vectors of its tokenizer's pieces: a Hugging Face model directory (a ptm
export among them) or a ptm run or checkpoint. A model's words are its pieces that spell a word in one token, as
SimilarWords reads them (`▁walk` as "walk"; not `##ing`, which is part of a word), special tokens left out.
`--dataset` keeps only the words of a ptm dataset's vocabulary (spelled in one of its tokens). The output has one
line per word: the word, then its `--top` nearest words, most similar first (those below `--min-similarity` left
out, a word without any left out). The search takes a block of rows at a time (never the whole V x V matrix), on
the GPU where there is one.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile

import numpy as np
import torch
from tqdm import tqdm

from data_prep import PrepError
from ptm.files import write_text

BLOCK = 1 << 24  # similarities computed at once (64 MB of float32)
_RESERVED = re.compile(r"\[unused\d+\]")  # BERT's and data_prep's placeholder pieces


def tokenizer_words(tok) -> dict[str, int]:
    """The words `tok` spells in one token -> the first piece that decodes to each (special tokens, sentinels and
    reserved [unusedN] pieces left out)."""
    from pretrain.data.masking import encode_after

    special = set(tok.special.values())
    words: dict[str, int] = {}
    for i in range(tok.vocab_size - tok.sentinels):
        word = tok.decode([i]).strip()
        if i not in special and word and not _RESERVED.fullmatch(word) and "\ufffd" not in word \
                and not any(c.isspace() for c in word):
            words.setdefault(word, i)
    forms = [encode_after(tok, prefix, list(words)) for prefix in ("", " ", "\u3002")]  # as SimilarWords reads them
    return {w: i for (w, i), *spelled in zip(words.items(), *forms) if any(s is not None and len(s) == 1
                                                                             for s in spelled)}


def read_vectors(path: str, keep: set[str] | None = None) -> tuple[list[str], torch.Tensor]:
    """The words and vectors of a word2vec/fastText text file (the first line of a word kept), those in `keep` only."""
    words, rows, seen = [], [], set()
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                word, *numbers = line.split() or [""]
                if not word or (n == 1 and len(numbers) == 1 and word.isdecimal() and numbers[0].isdecimal()):
                    continue  # a blank line; the `count dim` header
                if rows and len(numbers) != len(rows[0]) or not numbers:
                    raise PrepError(f"{path}:{n}: {len(numbers)} numbers after the word, not "
                                    f"{len(rows[0]) if rows else 'at least 1'}; pass a text vectors file "
                                    "(word v1 v2 ... a line)")
                if word in seen or (keep is not None and word not in keep):
                    continue
                try:
                    rows.append(np.array(numbers, dtype=np.float32))
                except ValueError:
                    raise PrepError(f"{path}:{n}: {word!r} is not followed by numbers; pass a text vectors file "
                                    "(word v1 v2 ... a line)") from None
                words.append(word)
                seen.add(word)
    except UnicodeDecodeError:
        raise PrepError(f"{path} is not UTF-8 text: a word2vec binary file? Save the vectors as text "
                        "(gensim: save_word2vec_format(path, binary=False))") from None
    if not words:
        raise PrepError(f"{path} has no vectors" + (" of the dataset's words" if keep is not None else ""))
    return words, torch.from_numpy(np.stack(rows))


def model_vectors(path: str, keep: set[str] | None = None) -> tuple[list[str], torch.Tensor]:
    """The words of a Hugging Face model directory's or a ptm run's tokenizer and their input word embeddings."""
    from data_prep.tokenizer import load_tokenizer
    from pretrain import checkpoint as C

    try:
        with tempfile.TemporaryDirectory() as tmp:
            if os.path.isfile(os.path.join(path, "config.json")):
                from checkpoints_tools.hf import import_tokenizer

                import_tokenizer(path, tmp)
                tok, weight = load_tokenizer(tmp), _hf_embeddings(path)
            else:
                ckpt = C.check_complete(C.resolve(path))
                tok, pieces = load_tokenizer(os.path.join(ckpt, "tokenizer")), C.Pieces(ckpt)
                if "embeddings.word.weight" not in pieces.params:
                    raise PrepError(f"{ckpt} has no word embeddings (embeddings.word.weight); pass another model "
                                    "or a vectors file")
                weight = pieces.full("param", "embeddings.word.weight")
            words = {w: i for w, i in tokenizer_words(tok).items() if (keep is None or w in keep) and i < len(weight)}
    except C.CheckpointError as e:
        raise PrepError(str(e)) from None
    if not words:
        raise PrepError(f"{path}: " + ("none of its words is in --dataset's vocabulary" if keep is not None else
                                       "none of its tokenizer's pieces spells a word in one token"))
    return list(words), weight.detach().float()[list(words.values())]


def _hf_embeddings(path: str) -> torch.Tensor:
    import transformers

    from checkpoints_tools.hf import quiet_load

    try:
        with quiet_load():
            return transformers.AutoModel.from_pretrained(path).get_input_embeddings().weight
    except Exception as e:  # transformers' reasons a directory does not load
        raise PrepError(f"{path}: transformers cannot load the model ({str(e).splitlines()[0]}); pass a directory "
                        "that save_pretrained wrote") from None


def nearest(vectors: torch.Tensor, top: int, progress: bool = False):
    """For each row, in blocks of rows: the cosine similarities and rows of its `top` nearest other rows, most similar
    first."""
    unit = torch.nn.functional.normalize(vectors.float(), dim=1).to("cuda" if torch.cuda.is_available() else "cpu")
    n, top = len(unit), min(top, len(unit) - 1)
    step = max(1, BLOCK // n)
    with tqdm(total=n, unit="word", desc="similar words", dynamic_ncols=True, file=sys.stderr,
              disable=not (progress and sys.stderr.isatty())) as bar:
        for start in range(0, n, step):
            sims = unit[start:start + step] @ unit.T
            rows = torch.arange(len(sims), device=sims.device)
            sims[rows, rows + start] = -torch.inf  # not a word's own neighbour
            values, ids = sims.topk(top, dim=1)
            yield values.cpu(), ids.cpu()
            bar.update(len(sims))


def similar_words(source: str, out: str, top: int = 5, min_similarity: float | None = None,
                  dataset: str | None = None, progress: bool = True) -> int:
    """Write the similar-words file `out` of `source` (a vectors file or a model, see the module's docstring);
    returns the number of words written."""
    if not os.path.exists(source):
        raise PrepError(f"{source} not found; pass a text vectors file, a Hugging Face model directory or a ptm run")
    if min_similarity is not None and not -1 <= min_similarity <= 1:
        raise PrepError(f"--min-similarity {min_similarity} is not a cosine similarity (-1 to 1)")
    keep = None
    if dataset is not None:
        from data_prep.tokenizer import load_tokenizer

        keep = set(tokenizer_words(load_tokenizer(dataset)))
    words, vectors = (model_vectors if os.path.isdir(source) else read_vectors)(source, keep)
    lines, first = [], 0
    for sims, ids in nearest(vectors, top, progress):
        for row_sims, row_ids in zip(sims.tolist(), ids.tolist()):
            similar = [words[j] for s, j in zip(row_sims, row_ids) if min_similarity is None or s >= min_similarity]
            if similar:
                lines.append(" ".join([words[first], *similar]) + "\n")
            first += 1
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    write_text(out, "".join(lines))
    return len(lines)
