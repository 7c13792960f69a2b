"""ptm: distributed pretraining for BERT, GPT-2 and ERNIE."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ptm")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+src"
