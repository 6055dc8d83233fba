"""The answers: statistics over seeds, the reports beside the papers' numbers, and their plots."""
