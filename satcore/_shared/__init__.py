"""What every layer uses: the error hierarchy, shape checks, printable names, optional packages."""
