"""What a launch file asks for: the search space or ablation grid, checked before anything starts."""
