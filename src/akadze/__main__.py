"""``python -m akadze`` runs the command line."""

from akadze.cli import main

main()
