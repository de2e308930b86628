"""Shared pieces of the example scripts: data, models, training, measurement, output.

The scripts in ``examples/`` import this package (they put ``examples/`` on
``sys.path`` by being run from it).  Nothing here is part of the satcore API.
"""
