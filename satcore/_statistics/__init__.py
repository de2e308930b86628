"""Streaming statistics: one batch's sums (moments), a candidate's running sums, candidates in depth order."""
