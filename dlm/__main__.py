"""Lets `python -m dlm` run the command line."""

from dlm.cli.main import main

main()
