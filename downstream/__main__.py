from downstream.cli import main
from ptm.cli import run

run(main)
