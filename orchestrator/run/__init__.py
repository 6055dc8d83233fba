"""Launching a plan on Ray Tune: the trial function, the searchers, the callbacks, the dry run's cost."""
