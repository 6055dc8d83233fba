"""The `orchestrator` command: parser.py declares the commands and their options, process.py runs
one as a process (exit statuses, signals, console streams), and a module per command, or per kind
of command, holds its code, imported only when it is chosen."""
