"""`inspect` and the end-of-build summary: human-readable views of a dataset."""
from __future__ import annotations

import numpy as np

from data_prep.dataset import Corpus

TOP_TOKEN_SAMPLE = 20_000_000  # tokens counted for the top-token table


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def summary(m: dict, seconds: float | None) -> str:
    s = m["stats"]
    lines = [
        f"dataset: {m['num_documents']:,} documents, {m['num_tokens']:,} tokens, {m['num_sentences']:,} sentences "
        f"in {len(m['shards'])} shards ({_mb(sum(x['bytes'] for x in m['shards']))})",
        f"tokenizer: {m['tokenizer']['kind']}, vocab {m['vocab_size']:,}, ids stored as {m['token_dtype']}",
        f"records read: {s['records']:,}; dropped: {s['filtered_short']:,} too short, {s['filtered_long']:,} too long, "
        f"{s['duplicates']:,} duplicates, {sum(s['skipped'].values()):,} unreadable",
    ]
    lines += [f"  skipped {n:,} x {reason}" for reason, n in sorted(s["skipped"].items())]
    if s["skipped"]:
        lines.append("  (each skipped record is listed with file and line in rejects.txt)")
    if seconds:
        lines.append(f"time: {seconds:.1f}s, {s['chars'] / seconds / 1e6:.2f} M chars/s, "
                     f"{m['num_tokens'] / seconds:,.0f} tokens/s, {m['num_documents'] / seconds:,.0f} docs/s")
    return "\n".join(lines)


def _histogram(lengths: np.ndarray, width: int = 40) -> list[str]:
    if not len(lengths):
        return []
    edges = np.unique(np.geomspace(1, max(int(lengths.max()), 2) + 1, num=12).astype(np.int64))
    counts, _ = np.histogram(lengths, bins=edges)
    top = max(int(counts.max()), 1)
    return [f"  {lo:>8,}-{hi - 1:<8,} {c:>9,} {'#' * int(round(width * c / top))}"
            for lo, hi, c in zip(edges[:-1], edges[1:], counts)]


def inspect(directory: str, samples: int = 1, seed: int = 0, top: int = 20) -> str:
    corpus = Corpus(directory)
    m = corpus.manifest
    tok = corpus.tokenizer()
    lengths = corpus.doc_lengths()
    out = [summary(m, None), "",
           f"document length in tokens: min {lengths.min():,}, median {int(np.median(lengths)):,}, "
           f"mean {lengths.mean():,.1f}, max {lengths.max():,}", *_histogram(lengths), ""]
    rng = np.random.default_rng(seed)
    for i in sorted(rng.choice(len(corpus), size=min(samples, len(corpus)), replace=False).tolist()):
        ids, starts = corpus.tokens(i), corpus.sentence_starts(i)
        bounds = [*(starts.tolist() or [0]), len(ids)]  # (--structure none records no sentences: one run)
        sents = [tok.decode(ids[a:b]).strip() for a, b in zip(bounds[:-1], bounds[1:])]
        shard = m["sources"][int(corpus._locate(i)[0].batch.column("source_file")[corpus._locate(i)[1]].as_py())]
        origin = f" ({shard['origin']})" if "origin" in shard else ""  # (data_prep words' staged text)
        out.append(f"document {i} ({len(ids)} tokens, {len(starts)} sentences, from {shard['path']}{origin}), "
                   "sentences separated by ' | ':")
        text = " | ".join(sents)
        out += [f"  {text[:1500]}{' ...' if len(text) > 1500 else ''}", ""]
        words = np.flatnonzero(corpus.word_start(i)).tolist() + [len(ids)]
        shown = [tok.decode(ids[a:b]).strip() or "␣" for a, b in zip(words[:12], words[1:13])]  # ␣: a lone space
        if shown:
            out.append("  first words: " + " / ".join(shown))
        for kind, spans in (("phrases", corpus.phrase_spans(i)), ("entities", corpus.entity_spans(i))):
            if len(spans):
                out.append(f"  {kind}: " + ", ".join(tok.decode(ids[a:b]).strip() for a, b in spans[:10].tolist()))
        out.append("")
    counts = np.zeros(m["vocab_size"], dtype=np.int64)
    seen = 0
    for shard in corpus.shards:
        vals = shard.values["input_ids"][: TOP_TOKEN_SAMPLE - seen]
        counts += np.bincount(vals, minlength=m["vocab_size"])
        seen += len(vals)
        if seen >= TOP_TOKEN_SAMPLE:
            break
    order = np.argsort(-counts, kind="stable")[:top]
    out.append(f"top {top} tokens (of {seen:,} counted):")
    out += [f"  {int(t):>7} {tok.piece(int(t))!r:<20} {counts[t]:>12,} {100 * counts[t] / max(seen, 1):5.2f}%"
            for t in order]
    return "\n".join(out)
