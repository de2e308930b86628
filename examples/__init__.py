"""Example scripts, run from the repository root as ``python -m examples.<name>`` (they import ``zoo``)."""
