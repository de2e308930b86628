"""Files: the dump format, the safe .npz reader, atomic writes, and what a probe returns."""
