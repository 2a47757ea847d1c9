"""Offline preparation: split ONNX models into per-layer stages and profile them."""
