from checkpoints_tools.cli import main
from ptm.cli import run, stop_on_sigterm

stop_on_sigterm()  # (kill, scancel: what was written goes, as on Ctrl-C)
run(main)
