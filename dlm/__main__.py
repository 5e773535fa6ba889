"""Lets `python -m dlm` run the command line."""

from dlm.cli.main import main

if __name__ == "__main__":
    main()
