"""downstream: fine-tune and evaluate what ptm pretrains (`ptm eval`), and compare families at an equal budget
(`ptm compare`).

`python -m downstream --help` lists the commands; docs/downstream.md explains tasks, models and metrics.
"""


class TaskError(Exception):
    """A problem with a task's files or options; the CLI prints it as one line naming the file, the line and the
    fix, and exits non-zero."""
