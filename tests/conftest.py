"""Shared fixtures: a small store of real split networks, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads.zoo import write_zoo

# AgeNet and GenderNet are chains, GoogleNet has Inception branches.
SMALL_ZOO = ("agenet", "gendernet", "googlenet")


@pytest.fixture(scope="session")
def small_zoo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Scale-0.05 zoo replicas, split, unprofiled (scheduling uses estimates)."""
    path = tmp_path_factory.mktemp("small-zoo")
    write_zoo(path, list(SMALL_ZOO), scale=0.05, profile=False)
    return path
