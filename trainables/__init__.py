"""Models, tasks and the training protocol: pure PyTorch, no Ray or MLflow imports."""

# The version of the tasks' data generators: bump when one changes its output, so that stale caches
# are never reused (tasks.base.cached) and a run's tags say which data it trained on. Here, not in
# tasks/, so that the commands that only read results know it without importing torch.
GENERATOR_VERSION = 7
