"""``python -m satcore``: the ``satcore`` command where its console script is not on PATH (an environment
run by its interpreter's path, a notebook's ``!python -m satcore ...``)."""
from satcore.cli.main import main

main(prog_name="satcore")
