"""``python -m fiberlite.cli`` = the ``fiberlite`` command."""
from . import main

main()
