"""Validity studies: what satcore's numbers and decisions are reliable for, measured (studies/README.md).

Run from the repository root as ``python -m studies.<name>``.
"""
