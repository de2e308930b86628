"""Scores computed from the sums (growth value, AG, noise floors) and the finished report they lead to."""
