"""Text renderings of reports (the table `satcore score` prints)."""
