from checkpoints_tools.cli import main
from ptm.cli import run

run(main)
