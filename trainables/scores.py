"""The scores an evaluation reports, by name (the kinds in kinds.py say which of them each reports).

Torch-free, so that the commands that only read results (`status`, `best`, the report) know which
scores are lower-is-better without importing torch.
"""

# In the order the kinds name them: accuracy; token and exact-sequence accuracy; perplexity; L1
# error and L1 relative to predicting zero.
SCORES = ("acc", "token_acc", "seq_acc", "perplexity", "l1", "rel_l1")
LOWER_IS_BETTER = {"l1", "rel_l1", "perplexity"}
