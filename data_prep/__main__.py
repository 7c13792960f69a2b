from data_prep.cli import main
from ptm.cli import run

run(main)
