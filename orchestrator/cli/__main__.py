"""`python -m orchestrator.cli`: the command as the `orchestrator` console script runs it."""

from .process import console

if __name__ == "__main__":
    console()
