"""``python -m stepstream serve``: the same as the ``stepstream`` command."""

from stepstream._cli import main

main()
