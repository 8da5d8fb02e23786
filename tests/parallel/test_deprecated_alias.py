"""Plugins written before `distributed/` was split still import the communicator interface."""

from __future__ import annotations

import importlib
import sys

import pytest

from fastdeploy.plugins.api import Communicator, RendezvousInfo


def test_the_old_communicator_module_warns_and_gives_the_same_classes():
    sys.modules.pop("fastdeploy.distributed.communicator", None)
    with pytest.warns(DeprecationWarning, match="fastdeploy.parallel.communicator"):
        old = importlib.import_module("fastdeploy.distributed.communicator")
    assert old.Communicator is Communicator
    assert old.RendezvousInfo is RendezvousInfo
