"""The example plugin packages declare their metadata the way current setuptools wants it.

A `license = { text = ... }` table makes setuptools >= 77 warn on every install; the SPDX string
form needs setuptools >= 77 to build, so the build requirement must say so.
"""

from __future__ import annotations

import glob
import os

import pytest
from packaging.licenses import canonicalize_license_expression
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYPROJECTS = sorted(glob.glob(os.path.join(ROOT, "plugins", "*", "pyproject.toml")))


def test_there_are_example_plugins():
    assert len(PYPROJECTS) >= 2


@pytest.mark.parametrize("path", PYPROJECTS, ids=lambda p: os.path.basename(os.path.dirname(p)))
def test_license_is_an_spdx_expression_and_setuptools_can_read_it(path):
    with open(path, "rb") as handle:
        pyproject = tomllib.load(handle)
    license_ = pyproject["project"]["license"]
    assert isinstance(license_, str), "project.license must be an SPDX string, not a table"
    assert canonicalize_license_expression(license_) == license_
    (setuptools,) = [
        Requirement(r) for r in pyproject["build-system"]["requires"] if Requirement(r).name == "setuptools"
    ]
    assert not setuptools.specifier.contains("76.9"), "SPDX license strings need setuptools >= 77"
