"""A numpy device backend written against the 0.1 device contract."""
