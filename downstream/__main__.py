from downstream.cli import main, stop_alone
from ptm.cli import run

stop_alone()
run(main)
