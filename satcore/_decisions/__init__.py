"""Decisions read from scores: criteria and verdicts, predicted gains, the recipe, trial decisions and sweeps."""
