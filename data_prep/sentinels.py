"""T5's sentinels added to a finished dataset: `data_prep sentinels DATA --out DATA_T5 [--count 100]`.

Sentinels are ids appended after the vocabulary (data_prep.tokenizer), which text never encodes to, so the tokens
of the shards stay valid: the new dataset links the same shards (hard links, copies across file systems) beside
the tokenizer with its sentinels and a manifest that says so. Every family trains on it; span corruption needs it.
"""
from __future__ import annotations

import json
import os

import numpy as np

from data_prep import PrepError
from data_prep.tokenizer import load_tokenizer
from ptm.files import copy_file, write_json

MANIFEST = "manifest.json"


def add_sentinels(src: str, out: str, count: int = 100) -> dict:
    """Write the dataset `src` with `count` sentinels to `out`; returns its manifest."""
    path = os.path.join(src, MANIFEST)
    if not os.path.isfile(path):
        raise PrepError(f"{src} has no {MANIFEST}: not a finished dataset; pass a `data_prep build` output")
    if os.path.exists(out):
        raise PrepError(f"--out {out} exists; remove it or choose another directory")
    with open(path) as f:
        manifest = json.load(f)
    if manifest["tokenizer"].get("sentinels"):
        raise PrepError(f"{src} already has {manifest['tokenizer']['sentinels']} sentinels; train on it as it is")
    tok = load_tokenizer(os.path.join(src, manifest["tokenizer"].get("path", "tokenizer"))).with_sentinels(count)
    if tok.vocab_size > np.iinfo(np.dtype(manifest["token_dtype"])).max + 1:
        raise PrepError(f"{src} stores tokens as {manifest['token_dtype']}: {tok.vocab_size} ids do not fit; rebuild "
                        "it with `data_prep build --sentinels` instead")
    tmp = f"{out}.tmp{os.getpid()}"
    os.makedirs(tmp)
    for name in os.listdir(src):
        if name in (MANIFEST, "tokenizer") or os.path.isdir(os.path.join(src, name)):
            continue
        try:
            os.link(os.path.join(src, name), os.path.join(tmp, name))
        except OSError:
            copy_file(os.path.join(src, name), os.path.join(tmp, name))
    tok = tok.save(os.path.join(tmp, "tokenizer"))
    manifest["tokenizer"] = {**manifest["tokenizer"], **tok.meta()}
    manifest["vocab_size"] = tok.vocab_size
    manifest.setdefault("options", {})["sentinels"] = count
    write_json(os.path.join(tmp, MANIFEST), manifest)
    os.rename(tmp, out)
    return manifest
