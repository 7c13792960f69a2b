# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled loops of the text-structure pass (data_prep.text, data_prep.encode and data_prep.chinese call them):
word spans, phrase spans, span hashes, the tokens' places among words, sentence boundaries, sentencepiece offsets
and jieba's Chinese word starts, each one pass over a chunk's code points instead of a dozen numpy passes.
tests/test_text.py holds their results to the definitions in text.py (and the Chinese cuts to rjieba's)."""
import numpy as np

from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

cdef enum:
    SPACE = 0
    WORD = 1
    CJK = 2
    PUNCT = 3

cdef uint64_t B = 0x100000001B3  # the span hash's base


cdef inline uint8_t _class(uint32_t c, const uint8_t* table) noexcept nogil:
    if c <= 0xFFFF:
        return table[c]
    return CJK if (c >> 16) == 2 else PUNCT  # plane 2: CJK extensions


def word_spans(const uint32_t[::1] codes, const uint8_t[::1] classes, const uint8_t[::1] joiners,
               const uint8_t[::1] cut=None):
    """(starts, ends) of the words of text.word_spans; `joiners`: the BMP table of characters that join two
    letters or digits into one word; `cut`: 1 per code point where the CJK segmenter starts a word (None: every
    CJK character is a word)."""
    cdef Py_ssize_t n = codes.shape[0], i, k = 0, e = 0, m = 0
    mark_arr = np.empty(n + 1, dtype=np.uint8)  # per position: 1 a word starts there, 2 one ends there
    cdef uint8_t[::1] mark_view = mark_arr
    cdef uint8_t* mark = &mark_view[0]
    cdef const uint32_t* cp = &codes[0] if n else NULL
    cdef const uint8_t* table = &classes[0]
    cdef uint8_t prev = SPACE, prev_own = SPACE, own, nxt, c, start
    cdef bint segmented = cut is not None
    if segmented and cut.shape[0] != n:
        raise ValueError(f"word_spans: {cut.shape[0]} word-start marks for {n} characters")
    nxt = _class(cp[0], table) if n else SPACE
    for i in range(n):  # one pass, few branches: the classes of letters and spaces alternate unpredictably
        own, nxt = nxt, _class(cp[i + 1], table) if i + 1 < n else SPACE
        c = own  # don't, o'clock, state-of-the-art: a joiner between two letters or digits (their own classes)
        if own == PUNCT and i + 1 < n and prev_own == WORD and nxt == WORD and i > 0 \
                and joiners[cp[i] if cp[i] <= 0xFFFF else 0xFFFF]:
            c = WORD
        if c == CJK:
            start = (not segmented) | (prev != CJK) | (segmented and cut[i])
        else:
            start = (c != SPACE) & (c != prev)
        # a word ends where the next starts or at the first space after it
        mark[i] = start | ((prev != SPACE) & (start | (c == SPACE))) << 1
        m += start
        prev, prev_own = c, own
    mark[n] = (prev != SPACE) << 1
    starts_arr, ends_arr = np.empty(m + 1, dtype=np.int64), np.empty(m + 1, dtype=np.int64)
    cdef int64_t[::1] starts = starts_arr, ends = ends_arr
    for i in range(n + 1):  # compaction without branches: always write, advance where marked
        starts[k] = i
        k += mark[i] & 1
        ends[e] = i
        e += mark[i] >> 1
    return starts_arr[:m], ends_arr[:m]


cdef inline bint _all(const uint32_t* codes, int64_t a, int64_t b, const uint8_t* table) noexcept nogil:
    """Whether every character in [a, b) is in `table` (of the BMP; one past it counts as U+FFFF, in none).
    (The helpers take pointers: a memoryview argument costs two atomic reference counts per call.)"""
    cdef int64_t i
    for i in range(a, b):
        if not table[codes[i] if codes[i] <= 0xFFFF else 0xFFFF]:
            return False
    return True


cdef inline uint64_t _hash(const uint32_t* codes, int64_t a, int64_t b) noexcept nogil:
    cdef uint64_t h = 0, p = 1, c
    cdef int64_t i
    for i in range(a, b):
        c = codes[i]
        if 65 <= c <= 90:
            c += 32
        h += c * p
        p *= B
    return h


def span_hashes(const uint32_t[::1] codes, const int64_t[::1] starts, const int64_t[::1] ends):
    """A polynomial hash (mod 2**64) of each span's characters, ASCII lower-cased: equal words, equal hashes."""
    cdef Py_ssize_t j, m = starts.shape[0]
    out_arr = np.empty(m, dtype=np.uint64)
    cdef uint64_t[::1] out = out_arr
    for j in range(m):
        out[j] = _hash(&codes[0], starts[j], ends[j])
    return out_arr


cdef inline bint _member(const uint64_t* table, Py_ssize_t n, uint64_t h) noexcept nogil:
    """Whether h is in the sorted table[:n]."""
    cdef Py_ssize_t lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if table[mid] < h:
            lo = mid + 1
        else:
            hi = mid
    return lo < n and table[lo] == h


def phrase_spans(const uint32_t[::1] codes, const uint8_t[::1] alpha, const int64_t[::1] starts,
                 const int64_t[::1] ends, const uint64_t[::1] stop, int max_words):
    """(n, 2) spans of text.phrase_spans: runs of adjacent content words (all letters, hash not in the sorted
    `stop`) with no newline between them, cut into pieces of at most `max_words`; pieces of one word dropped."""
    cdef Py_ssize_t m = starts.shape[0], j, first = -1, last = -1, count = 0, in_run = 0, npairs = 0
    cdef int64_t i, c
    cdef uint64_t h
    cdef bint content, linked, prev_content = False
    out_arr = np.empty((m // 2 + 1, 2), dtype=np.int64)
    cdef int64_t[:, ::1] out = out_arr
    bits_arr = np.zeros(1 << 16, dtype=np.uint8)  # a hash's low 16 bits seen among the stopwords': most words skip
    cdef uint8_t[::1] bits = bits_arr           # the binary search
    for j in range(stop.shape[0]):
        bits[stop[j] & 0xFFFF] = 1
    cdef const uint32_t* cp = &codes[0]
    for j in range(m):
        content = _all(cp, starts[j], ends[j], &alpha[0])
        if content:
            h = _hash(cp, starts[j], ends[j])
            content = not (bits[h & 0xFFFF] and _member(&stop[0], stop.shape[0], h))
        linked = prev_content and content
        if linked:
            for i in range(ends[j - 1], starts[j]):
                if codes[i] == 10:
                    linked = False
                    break
        if content and (not linked or in_run % max_words == 0):  # a new piece starts here
            if count >= 2:
                out[npairs, 0], out[npairs, 1] = starts[first], ends[last]
                npairs += 1
            first, count = j, 0
            if not linked:
                in_run = 0
        if content:
            last, count, in_run = j, count + 1, in_run + 1
        prev_content = content
    if count >= 2:
        out[npairs, 0], out[npairs, 1] = starts[first], ends[last]
        npairs += 1
    return out_arr[:npairs]


def token_words(const uint32_t[::1] codes, const uint8_t[::1] space, const int64_t[::1] tok_starts,
                const int64_t[::1] tok_ends, const int64_t[::1] wstarts):
    """Each token's position (its last character; for a token of only characters in `space`, or none, the
    character after it) and whether it opens a word (its position falls in another word than the previous
    token's): (positions, word_start as uint8)."""
    cdef Py_ssize_t n = codes.shape[0], t, T = tok_starts.shape[0], w = 0, nw = wstarts.shape[0], word, last = -1
    cdef int64_t i, p
    cdef uint32_t c
    cdef bint solid
    cdef const uint32_t* cp = &codes[0]
    pos_arr = np.empty(T, dtype=np.int64)
    first_arr = np.empty(T, dtype=np.uint8)
    cdef int64_t[::1] pos = pos_arr
    cdef uint8_t[::1] first = first_arr
    for t in range(T):
        solid = not _all(cp, tok_starts[t], tok_ends[t], &space[0])
        p = tok_ends[t] - 1 if solid else tok_ends[t]
        pos[t] = p
        # the number of word starts <= p (searchsorted right), by walking: positions only grow
        if w > 0 and wstarts[w - 1] > p:
            w = 0
        while w < nw and wstarts[w] <= p:
            w += 1
        word = w
        first[t] = t == 0 or word != last
        last = word
    return pos_arr, first_arr


# ---- sentences ------------------------------------------------------------------------------------------
# A character's flags for the sentence rules (text.py builds the tables from Python's str methods)
cdef enum:  # bit i: the i-th of these
    SP = 1, CJK_CHAR = 2, UPPER = 4, DIGIT = 8, CJK_MARK = 16, BANG = 32, CJK_CLOSE = 64, LATIN_MARK = 128
    LATIN_CLOSE = 256, OPENS = 512, LSTRIP = 1024, SEP = 2048, LETTER = 4096
F_SPACE, F_CJK_CHAR, F_UPPER, F_DIGIT, F_CJK_MARK, F_BANG, F_CJK_CLOSE, F_LATIN_MARK, F_LATIN_CLOSE, F_OPENS, \
    F_LSTRIP, F_SEP, F_LETTER = SP, CJK_CHAR, UPPER, DIGIT, CJK_MARK, BANG, CJK_CLOSE, LATIN_MARK, LATIN_CLOSE, \
    OPENS, LSTRIP, SEP, LETTER
cdef enum:
    MAX_ABBREV = 9  # an abbreviation (no dots) is at most this long; 7 bits a character


cdef inline Py_ssize_t _past(const uint16_t[::1] f, Py_ssize_t i, uint16_t flag) noexcept nogil:
    """The first position >= i whose character lacks `flag` (len(f) where none does)."""
    cdef Py_ssize_t n = f.shape[0]
    while i < n and f[i] & flag:
        i += 1
    return i


cdef bint _period_ends(const uint32_t[::1] codes, const uint16_t[::1] f, const uint8_t[::1] lower,
                       const uint64_t[::1] abbreviations, Py_ssize_t at, Py_ssize_t following) noexcept nogil:
    """Whether a lone period at `at` ends its sentence: the word before it (text._LAST_WORD's search over the
    24 characters before it, $ also matching before a final newline, stripped of opening quotes, lower-cased)
    is neither empty, an abbreviation nor one letter, and the next word (at `following`) opens with an upper-case
    letter, a digit, a quote or bracket, or CJK."""
    cdef Py_ssize_t lo = at - 24 if at > 24 else 0, stop = at, start, k
    cdef uint64_t h = 0
    cdef bint ascii_word
    if at - 1 >= lo and codes[at - 1] == 10:
        stop = at - 1
    start = stop
    while start > lo and not (f[start - 1] & SEP):
        start -= 1
    while start < stop and f[start] & LSTRIP:
        start += 1
    if start == stop:
        return False
    if stop - start == 1 and f[start] & LETTER:
        return False
    if not f[following] & (UPPER | DIGIT | OPENS | CJK_CHAR):
        return False
    ascii_word = stop - start <= MAX_ABBREV
    k = start
    while ascii_word and k < stop:
        ascii_word = lower[k] != 0
        h = h * 128 + lower[k]
        k += 1
    return not (ascii_word and _member(&abbreviations[0], abbreviations.shape[0], h))


def sentence_spans(const uint32_t[::1] codes, const uint16_t[::1] flag_table, const uint8_t[::1] lower_table,
                   const int64_t[::1] astral, const uint16_t[::1] astral_flags, const uint8_t[::1] astral_lower,
                   const uint8_t[::1] doc, const uint64_t[::1] abbreviations):
    """(n, 2) [start, end) of the sentences of text.sentence_spans, given the flags and ASCII lower case of every
    character of the BMP (tables), those of the characters past it (at positions `astral`), `doc` (n + 1 flags: a
    document starts there) and the sorted hashes of the abbreviations."""
    cdef Py_ssize_t n = codes.shape[0], i, j, end, following, newlines, prev_cut = 0, start = 0, count = 0
    f_arr, lower_arr = np.empty(n, dtype=np.uint16), np.empty(n, dtype=np.uint8)
    cdef uint16_t[::1] f = f_arr
    cdef uint8_t[::1] lower = lower_arr
    cdef uint32_t c
    for i in range(n):
        c = codes[i] if codes[i] <= 0xFFFF else 0xFFFF
        f[i], lower[i] = flag_table[c], lower_table[c]
    for j in range(astral.shape[0]):
        f[astral[j]], lower[astral[j]] = astral_flags[j], astral_lower[j]
    cut_arr = np.zeros(n + 1, dtype=np.uint8)
    cdef uint8_t[::1] cut = cut_arr
    i = 0
    while i < n:
        if f[i] & SP:  # a paragraph starts at the first newline of a whitespace run holding two or more
            j, newlines, end = i, 0, -1
            while j < n and f[j] & SP:
                if codes[j] == 10:
                    newlines += 1
                    if end < 0:
                        end = j
                j += 1
            if newlines >= 2:
                cut[end] = 1
            i = j
        elif f[i] & CJK_MARK:  # 。！？… closers
            j = i
            while j < n and f[j] & CJK_MARK:
                j += 1
            cut[_past(f, j, CJK_CLOSE)] = 1
            i = j
        else:
            i += 1
    i = 0
    while i < n:
        if f[i] & BANG:  # ! ? closers before a CJK character
            j = i
            while j < n and f[j] & BANG:
                j += 1
            end = _past(f, j, CJK_CLOSE)
            if end < n and f[end] & CJK_CHAR:
                cut[end] = 1
            i = j
        else:
            i += 1
    i = 0
    while i < n:
        if f[i] & LATIN_MARK:  # . ! ? closers, whitespace, a character
            j = i
            while j < n and f[j] & LATIN_MARK:
                j += 1
            end = _past(f, j, LATIN_CLOSE)
            following = _past(f, end, SP)
            if end < n and f[end] & SP and following < n and (
                    j - i != 1 or codes[i] != 46 or _period_ends(codes, f, lower, abbreviations, i, following)):
                cut[end] = 1
            i = j
        else:
            i += 1
    cut[n] = 1
    for i in range(1, n + 1):
        cut[i] = cut[i] or doc[i]
        count += cut[i]
    out_arr = np.empty((count, 2), dtype=np.int64)
    cdef int64_t[:, ::1] out = out_arr
    cdef bint solid, moved = False
    count = 0
    for i in range(1, n + 1):  # a piece of only whitespace joins the next sentence, or is dropped before a document
        if not cut[i]:
            continue
        solid = False
        for j in range(prev_cut, i):
            if not f[j] & SP:
                solid = True
                break
        if solid:
            out[count, 0], out[count, 1] = start, i
            count += 1
        moved = solid or doc[i]
        if moved:
            start = i
        prev_cut = i
    if count and not moved:
        out[count - 1, 1] = n  # trailing whitespace stays with the last sentence
    return out_arr[:count]


def sentence_bodies(const uint32_t[::1] codes, const uint8_t[::1] classes, const int64_t[::1] starts):
    """For sentences starting at `starts`: where each one's first non-space character is, and whether a newline
    comes before it (the sentence opens a paragraph)."""
    cdef Py_ssize_t n = codes.shape[0], k, m = starts.shape[0]
    cdef int64_t i
    body_arr, para_arr = np.empty(m, dtype=np.int64), np.zeros(m, dtype=bool)
    cdef int64_t[::1] body = body_arr
    cdef uint8_t[::1] para = para_arr.view(np.uint8)
    for k in range(m):
        i = starts[k]
        while i < n and _class(codes[i], &classes[0]) == SPACE:
            if codes[i] == 10:
                para[k] = 1
            i += 1
        body[k] = i
    return body_arr, para_arr


def piece_offsets(const int32_t[::1] ids, const int64_t[::1] counts, const int64_t[::1] lengths,
                  const int64_t[::1] chars, const uint8_t[::1] space_first, const uint8_t[::1] byte,
                  const uint8_t[::1] continuation, const uint8_t[::1] unknown, bint dummy_prefix):
    """Each sentencepiece token's character [start, end) in its text, from per-piece lengths (a "▁" is one space,
    the dummy prefix none, a byte-fallback character sits on its last byte), for texts of `counts` tokens and
    `lengths` characters; and the texts where they do not add up or that hold an unknown piece (their offsets are
    sentencepiece's to give)."""
    cdef Py_ssize_t t, j, first = 0, T = ids.shape[0], bad_count = 0
    cdef int64_t pos, length, unk
    starts_arr, ends_arr = np.empty(T, dtype=np.int64), np.empty(T, dtype=np.int64)
    bad_arr = np.empty(counts.shape[0], dtype=np.int64)
    cdef int64_t[::1] starts = starts_arr, ends = ends_arr, bad = bad_arr
    for t in range(counts.shape[0]):
        pos, unk = 0, 0
        for j in range(first, first + counts[t]):
            if byte[ids[j]]:  # one character for the last byte of its UTF-8 sequence
                length = not (j + 1 < T and continuation[ids[j + 1]])
            else:
                length = chars[ids[j]] - (dummy_prefix and j == first and space_first[ids[j]])
            starts[j] = pos
            pos += length
            ends[j] = pos
            unk += unknown[ids[j]]
        if pos != lengths[t] or unk:
            bad[bad_count] = t
            bad_count += 1
        first += counts[t]
    return starts_arr, ends_arr, bad_arr[:bad_count]


# --- Chinese words: jieba's dictionary and its most probable route, as rjieba (jieba-rs) cuts without HMM ---

from libc.math cimport NAN, log
from libc.stdlib cimport calloc, free

cdef uint64_t MIX = 0x9E3779B97F4A7C15  # a slot: the high half of key * MIX
cdef Py_ssize_t ROOT = 0x30000  # planes 0-2: first characters looked up in an array


cdef int FBITS = 17  # a node: key << FBITS | its frequency's rank among the words' (0: only a prefix, no word)
cdef uint64_t FMASK = (1 << 17) - 1


cdef inline bint _ideograph(uint32_t c) noexcept nogil:
    """jieba-rs's CJK ranges (its is_cjk)."""
    return (0x3400 <= c <= 0x4DBF or 0x4E00 <= c <= 0x9FFF or 0xF900 <= c <= 0xFAFF or 0x20000 <= c <= 0x2A6DF
            or 0x2A700 <= c <= 0x2EBEF or 0x2F800 <= c <= 0x2FA1F)


cdef inline bint _alnum(uint32_t c) noexcept nogil:
    return 48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122


cdef inline bint _han(uint32_t c) noexcept nogil:
    """jieba's RE_HAN_DEFAULT class: what a dictionary block is made of."""
    return _ideograph(c) or _alnum(c) or c == 43 or c == 35 or c == 38 or c == 46 or c == 95 or c == 37 or c == 45


def dictionary_entries(const uint32_t[::1] text):
    """(starts, lengths, freqs) of the words of a jieba dictionary file's text (code points): a word, then its
    frequency (0 when absent) and an optional tag per line, separated by whitespace."""
    cdef Py_ssize_t n = text.shape[0], i = 0, a, m = 0, lines = 1
    for i in range(n):
        lines += text[i] == 10
    starts_arr, lengths_arr, freqs_arr = (np.empty(lines, dtype=np.int64) for _ in range(3))
    cdef int64_t[::1] starts = starts_arr, lengths = lengths_arr, freqs = freqs_arr
    i = 0
    while i < n:
        while i < n and (text[i] == 32 or text[i] == 9 or text[i] == 13):
            i += 1
        a = i
        while i < n and not (text[i] == 10 or text[i] == 32 or text[i] == 9 or text[i] == 13):
            i += 1
        if i > a:
            starts[m], lengths[m], freqs[m] = a, i - a, 0
            while i < n and (text[i] == 32 or text[i] == 9):
                i += 1
            while i < n and 48 <= text[i] <= 57:
                freqs[m] = freqs[m] * 10 + text[i] - 48
                i += 1
            m += 1
        while i < n and text[i] != 10:
            i += 1
        i += 1
    return starts_arr[:m], lengths_arr[:m], freqs_arr[:m]


cdef class Dictionary:
    """A jieba dictionary as a trie of its words, each node a uint64 in an open-addressing table, keyed exactly by
    its parent's slot and its last character. Words in order: a word given twice keeps its last frequency, and the
    total is the sum over distinct words, as jieba-rs's load_dict and add_word leave them."""
    cdef uint64_t* table
    cdef uint64_t mask
    cdef int64_t[::1] root  # the slot of each first character below ROOT, -1: none
    cdef double[::1] logf  # per frequency rank: ln(frequency) (rank 0: NaN)
    cdef readonly int64_t total
    cdef double logtotal

    def __cinit__(self, const uint32_t[::1] pool, const int64_t[::1] starts, const int64_t[::1] lengths,
                  const int64_t[::1] freqs):
        cdef Py_ssize_t i
        cdef Py_ssize_t size = 1 << 10
        while size * 2 < 3 * np.sum(lengths) // 2:  # words share prefixes: about half as many nodes as characters
            size *= 2
        word = None
        while word is None:  # a table at most 2/3 full, doubled until the words fit
            word = self._build(pool, starts, lengths, size)
            size *= 2
        at = np.flatnonzero(word >= 0)
        freq = np.asarray(freqs)[word[at]]
        self.total = freq.sum()
        self.logtotal = log(<double> self.total)
        ranks, rank = np.unique(freq, return_inverse=True)
        if len(ranks) >= FMASK:
            raise ValueError(f"jieba dictionary: {len(ranks)} distinct frequencies, at most {FMASK - 1} fit")
        with np.errstate(divide="ignore"):
            self.logf = np.concatenate([[np.nan], np.log(ranks.astype(np.float64))])
        cdef const int64_t[::1] at_v = at, rank_v = rank.astype(np.int64)
        for i in range(at_v.shape[0]):
            self.table[at_v[i]] |= <uint64_t> (rank_v[i] + 1)

    def _build(self, const uint32_t[::1] pool, const int64_t[::1] starts, const int64_t[::1] lengths,
               Py_ssize_t size):
        """Insert the words into a new table of `size` slots; per slot: the index of the last word ending there, -1
        for a prefix only, -2 for an empty slot; None where the nodes fill more than 2/3 of it."""
        cdef Py_ssize_t i, j, node, nodes = 0, limit = 2 * size // 3
        if size > 1 << 26:
            raise ValueError(f"jieba dictionary: more trie nodes than {(1 << 27) // 3} fit")
        free(self.table)
        self.table = <uint64_t*> calloc(size, sizeof(uint64_t))
        if self.table == NULL:
            raise MemoryError("the jieba dictionary's table")
        self.mask = size - 1
        word_arr = np.full(size, -2, dtype=np.int64)
        cdef int64_t[::1] word = word_arr
        self.root = np.full(ROOT, -1, dtype=np.int64)
        for i in range(starts.shape[0]):
            node = -1
            for j in range(lengths[i]):
                node = self._child(node, pool[starts[i] + j], True)
                if word[node] == -2:
                    word[node] = -1
                    nodes += 1
                    if nodes > limit:
                        return None
            if node >= 0:
                word[node] = i
        return word_arr

    def __dealloc__(self):
        free(self.table)

    cdef inline Py_ssize_t _child(self, Py_ssize_t parent, uint32_t c, bint insert) noexcept nogil:
        """The slot of node `parent`'s child by character c (parent -1: the root), or -1 where it has none
        (`insert`: add it)."""
        if parent < 0 and c < ROOT and (self.root[c] >= 0 or not insert):
            return self.root[c]
        cdef uint64_t key = <uint64_t> (parent + 1) << 21 | c
        cdef uint64_t slot = ((key * MIX) >> 32) & self.mask
        while self.table[slot] >> FBITS != key:
            if self.table[slot] == 0:
                if not insert:
                    return -1
                self.table[slot] = key << FBITS
                break
            slot = (slot + 1) & self.mask
        if parent < 0 and c < ROOT:
            self.root[c] = slot
        return slot

    def starts(self, const uint32_t[::1] codes, bint ideographs_only=True):
        """uint8 per code point: 1 where one of jieba's words starts (rjieba's cut(text, hmm=False)). Blocks
        of jieba's word characters are cut by the route of greatest probability over the dictionary's words
        (a lone character out of it counts once), runs of ASCII letters and digits the route leaves as single
        characters join into one word, and every other character is a word of its own (\\r\\n one).
        `ideographs_only`: leave blocks without a CJK ideograph marked at their first character only."""
        cdef Py_ssize_t n = codes.shape[0], a, b, i
        out_arr = np.zeros(n, dtype=np.uint8)
        score_arr, end_arr = np.empty(n + 1, dtype=np.float64), np.empty(n + 1, dtype=np.int64)
        cdef uint8_t[::1] out = out_arr
        cdef double[::1] score = score_arr
        cdef int64_t[::1] end = end_arr
        cdef bint any_ideograph
        i = 0
        while i < n:
            if not _han(codes[i]):  # each character a word (\r\n one)
                out[i] = not (codes[i] == 10 and i > 0 and codes[i - 1] == 13 and out[i - 1])
                i += 1
                continue
            a, any_ideograph = i, False
            while i < n and _han(codes[i]):
                any_ideograph = any_ideograph or _ideograph(codes[i])
                i += 1
            b = i
            out[a] = 1
            if any_ideograph or not ideographs_only:
                self._route(codes, a, b, score, end)
                self._mark(codes, a, b, end, out)
        return out_arr

    cdef void _route(self, const uint32_t[::1] codes, Py_ssize_t a, Py_ssize_t b, double[::1] score,
                     int64_t[::1] end) noexcept nogil:
        """For each k in [a, b): the best route's log probability from k to b and where its first word ends
        (ties: the longer word, as jieba-rs's max over (score, end) pairs)."""
        cdef Py_ssize_t k, j, node
        cdef double s, best, logf
        cdef int64_t best_end
        score[b] = 0.0
        for k in range(b - 1, a - 1, -1):
            node, best_end = -1, -1
            for j in range(k + 1, b + 1):
                node = self._child(node, codes[j - 1], False)
                if node < 0:
                    break
                logf = self.logf[self.table[node] & FMASK]
                if logf == logf:  # a word
                    s = (logf - self.logtotal) + score[j]
                    if best_end < 0 or s >= best:
                        best, best_end = s, j
            if best_end < 0:
                best, best_end = (0.0 - self.logtotal) + score[k + 1], k + 1
            score[k], end[k] = best, best_end

    cdef void _mark(self, const uint32_t[::1] codes, Py_ssize_t a, Py_ssize_t b, int64_t[::1] end,
                    uint8_t[::1] out) noexcept nogil:
        """Word starts along the route from a; single ASCII letters or digits in a row make one word."""
        cdef Py_ssize_t x = a, y, left = -1
        while x < b:
            y = end[x]
            if y - x == 1 and _alnum(codes[x]):
                if left < 0:
                    left = x
            else:
                if left >= 0:
                    out[left] = 1
                    left = -1
                out[x] = 1
            x = y
        if left >= 0:
            out[left] = 1
