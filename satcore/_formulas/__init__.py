"""Formulas on arrays: the growth value, AG, projectors, the fold test, Proposition 1, matched insertion,
optimizer maps, train/held-out alignment and the feature families' NumPy references."""
