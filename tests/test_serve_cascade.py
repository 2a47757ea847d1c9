"""The real CenterFace -> open-nsfw cascade through `masa serve`, from a photo.

The daemon offers examples/cascade/cascade.yaml's graph (CenterFace fed the
photo, open-nsfw fed the face crop of the example's plugin); a client sends
scikit-image's astronaut (a face: both networks run, the classifier's scores
equal the two packages' own pipeline) and a text page (no face: the
classifier is skipped). Skipped without the optional real-model wheels.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_cascade import cascade, cascade_store, reference  # noqa: F401  (fixtures)
from test_serve import ROOT, Server

EXAMPLE = ROOT / "examples" / "cascade"


@pytest.mark.slow
@pytest.mark.real
def test_a_photo_runs_the_real_cascade_through_the_daemon(
        cascade, cascade_store: Path, reference, tmp_path: Path) -> None:  # noqa: F811
    config = tmp_path / "device.yaml"
    config.write_text(json.dumps({
        "store": str(cascade_store), "memory": "512MiB", "context": "wait",
        "listen": "127.0.0.1:0", "journal": str(tmp_path / "journal.sqlite"),
        "graphs": {"faces": {"workload": str(EXAMPLE / "cascade.yaml")}}}))
    server = Server(config, plugins=(EXAMPLE / "face_crop.py",))
    try:
        face = server.submit("faces", cascade.image_path(cascade.FACE_IMAGE).read_bytes(),
                             "image/png")
        page = server.submit("faces", cascade.image_path(cascade.NO_FACE_IMAGE).read_bytes(),
                             "image/png")
        with_face, without_face = server.wait(face, 300), server.wait(page, 300)
        outputs = server.outputs(face)
    finally:
        assert server.stop() == 0
    assert with_face["state"] == "done"
    assert {n: r["status"] for n, r in with_face["networks"].items()} == {
        "centerface": "done", "opennsfw": "done"}
    assert without_face["state"] == "done"
    assert without_face["networks"]["opennsfw"]["status"] == "skipped"
    assert without_face["networks"]["opennsfw"]["reason"] == "condition did not hold"
    (probabilities,) = [v for k, v in outputs.items() if k.startswith("opennsfw/")]
    _, (sfw, nsfw) = reference
    np.testing.assert_allclose(np.asarray(probabilities).reshape(-1), [sfw, nsfw], atol=1e-5)
    assert float(np.max(outputs["centerface/537"])) > 0.5
