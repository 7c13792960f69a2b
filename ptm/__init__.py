"""ptm: distributed pretraining of BERT, GPT, T5, XLNet, ELMo and their families."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ptm")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+src"


def shipped(name: str, source: str) -> str:
    """A folder of non-Python files that wheels carry as ptm/NAME (presets, sbatch scripts): there once installed from
    a wheel, the repository's SOURCE folder in a source tree and in editable installs."""
    import os
    from importlib.resources import files

    installed = files("ptm") / name
    return str(installed) if installed.is_dir() else os.path.join(os.path.dirname(os.path.dirname(__file__)), source)
