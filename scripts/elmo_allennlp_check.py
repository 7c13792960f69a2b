"""AllenNLP's ELMo on ptm's export: `_ElmoBiLm` loads ELMO_DIR (options.json + weights.hdf5 from `ptm convert
to-elmo`) and computes every layer of a few sentences; ptm's model from the same files computes them too; prints the
largest difference. AllenNLP 2.10.1 (its last release) needs torch < 1.13 and does not install beside ptm's stack:
run this where it imports (PYTHONPATH holding it and its packages; SHIM: a file to exec first, e.g. one that stubs
what huggingface_hub 1.x and a CPU torch lack). Not part of the tests for that reason.

    PYTHONPATH=ALLENNLP:DEPS:. SHIM=shim.py python scripts/elmo_allennlp_check.py ELMO_DIR
"""
import os
import sys

import numpy as np
import torch

if os.environ.get("SHIM"):
    exec(open(os.environ["SHIM"]).read())
from allennlp.modules.elmo import _ElmoBiLm, batch_to_ids  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from checkpoints_tools.bilm_tf import from_files, read_files  # noqa: E402
from pretrain.data.char_words import char_ids  # noqa: E402
from pretrain.models.char_bilm import ELMo  # noqa: E402
from pretrain.parallel import mcore  # noqa: E402

directory = sys.argv[1]
sentences = [s.split() for s in ("The quick brown fox jumps over the lazy dog .", "Return the value .",
                                 "中文 的 句子 也 可以", "x")]
cfg, state, _ = from_files(*read_files(directory))
ours = ELMo(cfg, tp=mcore.OneRank()).eval()
ours.load_state_dict(state, strict=False)
theirs = _ElmoBiLm(os.path.join(directory, "options.json"), os.path.join(directory, "weights.hdf5")).eval()
lengths = [len(s) + 2 for s in sentences]  # with <S> and </S>, which AllenNLP adds itself
chars = torch.zeros(len(sentences), max(lengths), 50, dtype=torch.long)
for i, s in enumerate(sentences):
    chars[i, :lengths[i]] = torch.as_tensor(np.stack([char_ids(w) for w in ["<S>", *s, "</S>"]]))
with torch.no_grad():
    mine = ours.layers(chars, torch.tensor(lengths))
    out = theirs(batch_to_ids(sentences))["activations"]
worst = max(float((a[i, :n] - b[i, :n]).abs().max()) for a, b in zip(mine, out) for i, n in enumerate(lengths))
print(f"{len(out)} layers of {len(sentences)} sentences: largest difference between AllenNLP and ptm {worst:.2e}")
