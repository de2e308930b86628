"""The framework-free grow-until-saturated loop and its JSON-lines log."""
