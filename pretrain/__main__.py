import sys

from pretrain import signals

if "train" in sys.argv[1:3]:  # (the deepspeed launcher puts --local_rank=N first)
    signals.pause("start")
    signals.block()  # first: stop signals during start-up are kept, and never reach the children
    signals.pause("imports")

from pretrain.cli import main  # noqa: E402
from ptm.cli import run  # noqa: E402

run(main)
