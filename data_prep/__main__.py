from data_prep.cli import main
from ptm.cli import run, stop_on_sigterm

stop_on_sigterm()  # (kill, scancel: a build stops as on Ctrl-C, saying so; it resumes after its last shard)
run(main)
