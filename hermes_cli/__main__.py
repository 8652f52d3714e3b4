"""``python -m hermes_cli``: the ``hermes`` command."""

from .cli.main import main

main()
