"""A member's configuration, in one room: the settings table that gives each setting its
flag, environment variable and config-file key (options.py, cheap: the CLI builds
`dlm node start` from it on every run), and the checked config with the data directory's
record of who made it (node_config.py). Import nothing here: the CLI pays for this file."""
