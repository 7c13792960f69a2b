"""The demo's last step: load the exported model with transformers and fill in masked words."""
import sys

import transformers

model_dir = sys.argv[1]
# The export keeps the whole pretraining model (BERT's NSP head and pooler too); the masked-LM model fill-mask loads
# leaves those out, which transformers reports key by key: not a problem here.
transformers.logging.set_verbosity_error()
fill = transformers.pipeline("fill-mask", model=model_dir, tokenizer=model_dir)
for text in ("Return the [MASK] of the two numbers.", "This function is [MASK] to the one above.",
             "If the file does not exist, an [MASK] is raised.", "床前明月光，疑是地上[MASK]。"):
    answers = ", ".join(f"{a['token_str'].strip() or repr(a['token_str'])} ({a['score']:.2f})" for a in fill(text, top_k=5))
    print(f"{text}\n    -> {answers}")
