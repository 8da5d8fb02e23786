"""Deprecated alias of `fastdeploy.parallel.communicator`, kept for plugins written before 0.2.

Import `Communicator` and `RendezvousInfo` from `fastdeploy.plugins.api`; this module goes in 0.3.
"""

import warnings

from fastdeploy.parallel.communicator import Communicator, RendezvousInfo

warnings.warn(
    "fastdeploy.distributed.communicator moved to fastdeploy.parallel.communicator; import Communicator "
    "from fastdeploy.plugins.api (this alias goes in 0.3)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["Communicator", "RendezvousInfo"]
