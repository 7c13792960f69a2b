"""data_prep: raw text to sharded, memory-mappable Arrow datasets with their tokenizer.

`python -m data_prep --help` lists the commands; `data_prep.dataset.Corpus` reads the result.
"""


class PrepError(Exception):
    """A problem with the user's input or options; the CLI prints it as one line and exits non-zero."""
