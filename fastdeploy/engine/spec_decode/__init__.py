"""Speculative decoding: proposers (prompt lookup, draft model) and verification; its option,
`speculative_config`, is parsed by `fastdeploy.speculative_config` in the configuration layer."""
