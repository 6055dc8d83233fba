"""The search service: everything that is not a model or a task.

  plan/    what a launch file asks for, checked before anything starts (load, sections, space, pairs,
           probes, study, storage)
  run/     launching it on Ray Tune: searchers, callbacks, the dry run's cost (launch, search,
           callbacks, cost)
  record/  what a launch leaves: MLflow and Optuna glue, the launch folder, best and export
  report/  the answers: statistics, reports and their plots
  cli/     the commands, over all four

Imports go one way: plan <- record <- report <- run <- cli.
"""
