"""Models, tasks and the training protocol: pure PyTorch, no Ray or MLflow imports."""
