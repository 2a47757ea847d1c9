"""The human-readable stage table of a prepared network (`masa prepare`, `masa demo`)."""

from __future__ import annotations

from collections.abc import Iterable

from masa.common.units import format_bytes
from model_prep.manifest import NetworkManifest


def stage_summary(manifest: NetworkManifest) -> Iterable[str]:
    """Lines of a stage table: id, layer type, weights, output bytes, operators."""
    yield f"{'stage':<8} {'type':<5} {'weights':>10} {'out':>10}  operators"
    for stage in manifest.stages:
        out_bytes = [t.size_bytes for t in stage.outputs]
        out_text = (format_bytes(sum(b for b in out_bytes if b is not None))
                    if out_bytes and None not in out_bytes else "dynamic")
        ops = ",".join(stage.op_types)
        yield (f"{stage.stage_id:<8} {stage.layer_type:<5} {format_bytes(stage.weight_bytes):>10} "
               f"{out_text:>10}  {ops[:60]}{' *' if stage.note else ''}")
