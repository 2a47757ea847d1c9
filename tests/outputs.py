"""A check tests share: a run's outputs equal each whole model's, job by job."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from model_prep.manifest import NetworkManifest
from model_prep.verify import run_whole_model


def assert_outputs_like_whole_models(outputs: Mapping[str, Mapping[str, np.ndarray]],
                                     manifests: Mapping[str, NetworkManifest],
                                     feeds: Mapping[str, Mapping[str, np.ndarray]],
                                     job_ids: Iterable[int]) -> None:
    """Every job's outputs of every network within float rounding (1e-5 of the
    largest value) of the whole model run on the same feeds."""
    job_ids = list(job_ids)
    for name, manifest in manifests.items():
        expected = run_whole_model(manifest.source_path, manifest, feeds[name])
        for job_id in job_ids:
            got = outputs[f"j{job_id}/{name}"]
            for output, value in expected.items():
                scale = max(1e-12, float(np.max(np.abs(value))))
                assert np.max(np.abs(got[output] - value)) <= 1e-5 * scale
