"""What a launch leaves behind and how it is read back: MLflow and Optuna glue, the launch folder,
best, export."""
