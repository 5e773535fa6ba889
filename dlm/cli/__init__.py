"""The `dlm` command: argument parsing, output and exit codes. Thin by design."""
