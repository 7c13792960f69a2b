"""`python -m ptm ...`: the `ptm` command without its console script (a source tree on PYTHONPATH)."""
from ptm.cli import main

main()
