"""``python -m omlx`` is the ``omlx`` command."""

from omlx.app.cli import main

main()
