"""The search service: everything that is not a model or a task."""
