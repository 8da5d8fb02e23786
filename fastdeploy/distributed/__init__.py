"""Deprecated: the modules once here moved (see docs/plugins.md, "Deprecations").

`fastdeploy.distributed.communicator` still resolves to `fastdeploy.parallel.communicator` until
0.3; import `Communicator` and `RendezvousInfo` from `fastdeploy.plugins.api` instead.
"""
