# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled loops of the text-structure pass (data_prep.text and data_prep.encode call them): word spans,
phrase spans, span hashes and the tokens' places among words, each one pass over a chunk's code points
instead of a dozen numpy passes. tests/test_text.py holds their results to the definitions in text.py."""
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
               const int64_t[::1] cuts=None):
    """(starts, ends) of the words of text.word_spans; `joiners`: the BMP table of characters that join two
    letters or digits into one word; `cuts`: where the CJK segmenter's words start (None: every CJK character is
    a word)."""
    cdef Py_ssize_t n = codes.shape[0], i, k, m = 0
    cls_arr, start_arr = np.empty(n, dtype=np.uint8), np.empty(n, dtype=np.uint8)
    cdef uint8_t[::1] cls_view = cls_arr, start_view = start_arr
    cdef uint8_t* cls = &cls_view[0] if n else NULL
    cdef uint8_t* start = &start_view[0] if n else NULL
    cdef const uint32_t* cp = &codes[0] if n else NULL
    cdef const uint8_t* table = &classes[0]
    cdef uint8_t prev = SPACE, prev_own = SPACE, own, nxt, c
    cdef bint segmented = cuts is not None
    nxt = _class(cp[0], table) if n else SPACE
    for i in range(n):
        own, nxt = nxt, _class(cp[i + 1], table) if i + 1 < n else SPACE
        c = own  # don't, o'clock, state-of-the-art: a joiner between two letters or digits (their own classes)
        if own == PUNCT and i + 1 < n and prev_own == WORD and nxt == WORD and i > 0 \
                and joiners[cp[i] if cp[i] <= 0xFFFF else 0xFFFF]:
            c = WORD
        cls[i] = c
        if c == CJK:
            start[i] = not segmented or prev != CJK
        else:
            start[i] = c != SPACE and c != prev
        m += start[i]
        prev, prev_own = c, own
    if segmented:  # a CJK word also starts at each segmenter boundary inside a CJK run
        for k in range(cuts.shape[0]):
            if 0 <= cuts[k] < n and cls[cuts[k]] == CJK and not start[cuts[k]]:
                start[cuts[k]] = 1
                m += 1
    starts_arr, ends_arr = np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64)
    cdef int64_t[::1] starts = starts_arr, ends = ends_arr
    cdef int64_t next_space = n, next_start = n
    k = m
    for i in range(n - 1, -1, -1):  # a word ends where the next one starts or at the first space after it
        if cls[i] == SPACE:
            next_space = i
        elif start[i]:
            k -= 1
            starts[k], ends[k] = i, min(next_space, next_start)
            next_start = i
    return starts_arr, ends_arr


cdef inline bint _all(const uint32_t[::1] codes, int64_t a, int64_t b, const uint8_t[::1] table) noexcept nogil:
    """Whether every character in [a, b) is in `table` (of the BMP; one past it counts as U+FFFF, in none)."""
    cdef int64_t i
    for i in range(a, b):
        if not table[codes[i] if codes[i] <= 0xFFFF else 0xFFFF]:
            return False
    return True


cdef inline uint64_t _hash(const uint32_t[::1] codes, int64_t a, int64_t b) noexcept nogil:
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
        out[j] = _hash(codes, starts[j], ends[j])
    return out_arr


cdef inline bint _member(const uint64_t[::1] table, uint64_t h) noexcept nogil:
    cdef Py_ssize_t lo = 0, hi = table.shape[0], mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if table[mid] < h:
            lo = mid + 1
        else:
            hi = mid
    return lo < table.shape[0] and table[lo] == h


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
    for j in range(m):
        content = _all(codes, starts[j], ends[j], alpha)
        if content:
            h = _hash(codes, starts[j], ends[j])
            content = not (bits[h & 0xFFFF] and _member(stop, h))
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
    pos_arr = np.empty(T, dtype=np.int64)
    first_arr = np.empty(T, dtype=np.uint8)
    cdef int64_t[::1] pos = pos_arr
    cdef uint8_t[::1] first = first_arr
    for t in range(T):
        solid = not _all(codes, tok_starts[t], tok_ends[t], space)
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
    return not (ascii_word and _member(abbreviations, h))


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
