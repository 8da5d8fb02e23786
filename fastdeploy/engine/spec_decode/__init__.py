"""Speculative decoding: proposers (prompt lookup, draft model), verification, configuration.

Kept free of imports so that `fastdeploy.config` can read `spec_decode.config` without pulling
in the engine.
"""
