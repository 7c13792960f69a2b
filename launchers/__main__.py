from launchers.cli import main
from ptm.cli import run

run(main)
