"""The model zoo: architecture replicas of the nine networks of the Masa paper.

This module owns the builders of the paper's networks (Table 1 of Cox et al.,
PerCom 2021 / Pervasive and Mobile Computing 2022) as ONNX graphs made with
`onnx.helper`, with seeded random weights, and `write_zoo`, which puts them
into a store through the offline preparator (model_prep.split, optionally
model_prep.profile), keeping each whole model beside its stages.

They are structure and cost replicas, NOT trained models: layer types, layer
order, channel widths, kernel sizes, input shapes and therefore weight bytes,
per-layer memory and compute match the published architectures, but the
outputs are meaningless. `scale` (0 < scale <= 1) multiplies every hidden
channel width and hidden fully-connected width (class counts stay), so weight
bytes shrink roughly with scale**2 for tests and the demo. See docs/zoo.md.

The same builder code runs in two modes: materialised (numpy weights from a
seeded Generator) and dry (only counts parameters), so the scale-1 size of a
500 MB model can be checked without allocating it.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from masa.common.errors import UserError
from model_prep.manifest import MANIFEST_NAME, NetworkManifest, load_manifest, write_manifest
from model_prep.prepare_cli import ensure_store, prepare_network
from model_prep.stage_files import DEFAULT_LOAD_MODE

log = logging.getLogger(__name__)

OPSET_VERSION = 13
# Opset 13 needs IR >= 7; IR 8 is old enough for every onnxruntime setup.cfg allows.
IR_VERSION = 8
MIB = 1024 * 1024
FLOAT_BYTES = 4


@dataclass(frozen=True)
class ZooSpec:
    """What a zoo network replicates, and the figures it must match at scale 1."""

    name: str  # store name (lower case)
    paper_name: str  # as written in the paper
    architecture: str  # the published architecture it follows
    input_shape: tuple[int, int, int, int]  # NCHW, batch 1
    conv_layers: int  # weighted convolution layers
    fc_layers: int  # fully-connected (Gemm) layers
    paper_storage_mib: float  # Table 1 storage; the sizes match MiB (see docs/zoo.md)
    output_name: str


ZOO_SPECS: dict[str, ZooSpec] = {
    spec.name: spec
    for spec in (
        ZooSpec("agenet", "AgeNet", "Levi & Hassner 2015 age CNN (8 age groups)",
                (1, 3, 227, 227), 3, 3, 44, "prob"),
        ZooSpec("gendernet", "GenderNet", "Levi & Hassner 2015 gender CNN (2 classes)",
                (1, 3, 227, 227), 3, 3, 44, "prob"),
        ZooSpec("facenet", "FaceNet", "CaffeNet face detector (Farfade et al. 2015, 2 classes)",
                (1, 3, 227, 227), 5, 3, 217, "prob"),
        ZooSpec("sos", "SoS", "AlexNet salient object subitizing (Zhang et al. 2015, 5 classes)",
                (1, 3, 227, 227), 5, 3, 218, "prob"),
        ZooSpec("googlenet", "GoogleNet", "GoogLeNet / Inception v1 (SoS head, 5 classes)",
                (1, 3, 224, 224), 57, 1, 23, "prob"),
        ZooSpec("tinyyolo", "TinyYOLO", "Darknet Tiny YOLO v2 VOC (9 conv, 125x13x13 output)",
                (1, 3, 416, 416), 9, 0, 62, "grid"),
        ZooSpec("emotionnet", "EmotionNet", "VGG-S emotion CNN (Levi & Hassner 2015, 7 classes)",
                (1, 3, 224, 224), 5, 3, 378, "prob"),
        ZooSpec("memnet", "MemNet", "MemNet, Hybrid-CNN/CaffeNet regressor (Khosla et al. 2015)",
                (1, 3, 227, 227), 5, 3, 217, "score"),
        ZooSpec("scenenet", "SceneNet", "Places205-AlexNet scene CNN (Zhou et al. 2014)",
                (1, 3, 227, 227), 5, 3, 221, "prob"),
    )
}
ZOO_NAMES: tuple[str, ...] = tuple(ZOO_SPECS)


def check_scale(scale: float) -> float:
    """The scale as a float, or UserError when it is not in (0, 1]."""
    if isinstance(scale, bool) or not isinstance(scale, int | float) or math.isnan(scale):
        raise UserError(f"--scale: expected a number with 0 < S <= 1, got {scale!r}")
    if not 0 < scale <= 1:
        raise UserError(f"--scale: expected a number with 0 < S <= 1, got {scale}")
    return float(scale)


def check_names(names: Sequence[str]) -> list[str]:
    """Zoo names, lower-cased and de-duplicated in order; UserError for unknown ones."""
    chosen: list[str] = []
    unknown = []
    for raw in names:
        name = raw.lower()
        if name not in ZOO_SPECS:
            unknown.append(raw)
        elif name not in chosen:
            chosen.append(name)
    if unknown:
        raise UserError(f"zoo network name: unknown network(s) "
                        f"{', '.join(repr(n) for n in unknown)} "
                        f"(expected some of: {', '.join(ZOO_NAMES)})")
    return chosen


# ---------------------------------------------------------------- graph builder


class _Net:
    """Appends layers to one ONNX graph and tracks every tensor's CHW shape.

    With `rng=None` it only counts parameters (dry mode): the graph structure is
    built the same way, no weight is allocated.
    """

    def __init__(self, scale: float, rng: np.random.Generator | None) -> None:
        self.scale = scale
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.parameter_count = 0
        self.conv_layers = 0
        self.fc_layers = 0

    def width(self, channels: int, multiple: int = 1) -> int:
        """A hidden width after scaling; a multiple of `multiple` (conv groups), >= 1."""
        return max(multiple, round(channels * self.scale / multiple) * multiple)

    def _weight(self, name: str, shape: tuple[int, ...], std: float) -> str:
        self.parameter_count += math.prod(shape)
        if self.rng is not None:
            values = self.rng.standard_normal(shape, dtype=np.float32)
            values *= np.float32(std)
            self.initializers.append(numpy_helper.from_array(values, name))
        return name

    def _constant(self, name: str, values: np.ndarray) -> str:
        """A non-random parameter (batch-norm statistics); counted like any weight."""
        self.parameter_count += values.size
        if self.rng is not None:
            self.initializers.append(numpy_helper.from_array(values.astype(np.float32), name))
        return name

    def conv(self, x: str, name: str, out_channels: int, kernel: int, stride: int = 1,
             pad: int = 0, group: int = 1, bias: bool = True) -> str:
        in_channels, height, width = self.shapes[x]
        fan_in = in_channels // group * kernel * kernel
        # He initialisation keeps activations of a deep ReLU stack in a finite range.
        std = math.sqrt(2.0 / fan_in)
        inputs = [x, self._weight(f"{name}.weight",
                                  (out_channels, in_channels // group, kernel, kernel), std)]
        if bias:
            inputs.append(self._weight(f"{name}.bias", (out_channels,), 0.01))
        self.nodes.append(helper.make_node(
            "Conv", inputs, [name], name=name, kernel_shape=[kernel, kernel],
            strides=[stride, stride], pads=[pad] * 4, group=group))
        out_height = (height + 2 * pad - kernel) // stride + 1
        out_width = (width + 2 * pad - kernel) // stride + 1
        self.shapes[name] = (out_channels, out_height, out_width)
        self.conv_layers += 1
        return name

    def gemm(self, x: str, name: str, out_features: int) -> str:
        (in_features,) = self.shapes[x]
        weight = self._weight(f"{name}.weight", (out_features, in_features),
                              math.sqrt(2.0 / in_features))
        bias = self._weight(f"{name}.bias", (out_features,), 0.01)
        self.nodes.append(helper.make_node("Gemm", [x, weight, bias], [name], name=name,
                                           transB=1))
        self.shapes[name] = (out_features,)
        self.fc_layers += 1
        return name

    def batch_norm(self, x: str, name: str) -> str:
        channels = self.shapes[x][0]
        # Near-identity statistics: a trained net's BN is close to this in scale.
        if self.rng is not None:
            gamma = 1.0 + 0.05 * self.rng.standard_normal(channels, dtype=np.float32)
            beta = 0.01 * self.rng.standard_normal(channels, dtype=np.float32)
        else:
            gamma = beta = np.zeros(channels, np.float32)
        inputs = [x, self._constant(f"{name}.scale", gamma), self._constant(f"{name}.bias", beta),
                  self._constant(f"{name}.mean", np.zeros(channels, np.float32)),
                  self._constant(f"{name}.var", np.ones(channels, np.float32))]
        self.nodes.append(helper.make_node("BatchNormalization", inputs, [name], name=name,
                                           epsilon=1e-5))
        self.shapes[name] = self.shapes[x]
        return name

    def _same_shape(self, op: str, x: str, name: str, **attributes: object) -> str:
        self.nodes.append(helper.make_node(op, [x], [name], name=name, **attributes))
        self.shapes[name] = self.shapes[x]
        return name

    def relu(self, x: str, name: str) -> str:
        return self._same_shape("Relu", x, name)

    def leaky_relu(self, x: str, name: str) -> str:
        return self._same_shape("LeakyRelu", x, name, alpha=0.1)

    def lrn(self, x: str, name: str, alpha: float = 1e-4, beta: float = 0.75,
            bias: float = 1.0, size: int = 5) -> str:
        # ONNX LRN divides alpha by `size`, exactly like Caffe's across-channel LRN.
        return self._same_shape("LRN", x, name, alpha=alpha, beta=beta, bias=bias, size=size)

    def softmax(self, x: str, name: str) -> str:
        return self._same_shape("Softmax", x, name, axis=-1)

    def max_pool(self, x: str, name: str, kernel: int, stride: int,
                 pads: tuple[int, int, int, int] = (0, 0, 0, 0), ceil: bool = False) -> str:
        """pads are (top, left, bottom, right); ceil follows Caffe's pooling arithmetic."""
        if ceil and any(pads):
            # ceil mode with padding has version-dependent edge rules; none of our nets need it.
            raise ValueError("ceil-mode pooling with padding is not supported")
        channels, height, width = self.shapes[x]

        def out_size(size: int, pad_total: int) -> int:
            span = size + pad_total - kernel
            return (-(-span // stride) if ceil else span // stride) + 1

        self.nodes.append(helper.make_node(
            "MaxPool", [x], [name], name=name, kernel_shape=[kernel, kernel],
            strides=[stride, stride], pads=[pads[0], pads[1], pads[2], pads[3]],
            ceil_mode=int(ceil)))
        self.shapes[name] = (channels, out_size(height, pads[0] + pads[2]),
                             out_size(width, pads[1] + pads[3]))
        return name

    def global_avg_pool_flat(self, x: str, name: str) -> str:
        channels = self.shapes[x][0]
        pooled = f"{name}_pool"
        self.nodes.append(helper.make_node("GlobalAveragePool", [x], [pooled], name=pooled))
        self.nodes.append(helper.make_node("Flatten", [pooled], [name], name=name, axis=1))
        self.shapes[pooled] = (channels, 1, 1)
        self.shapes[name] = (channels,)
        return name

    def flatten(self, x: str, name: str) -> str:
        self.nodes.append(helper.make_node("Flatten", [x], [name], name=name, axis=1))
        self.shapes[name] = (math.prod(self.shapes[x]),)
        return name

    def concat(self, xs: list[str], name: str) -> str:
        heights_widths = {self.shapes[x][1:] for x in xs}
        if len(heights_widths) != 1:
            raise ValueError(f"{name}: branches disagree on spatial size {heights_widths}")
        self.nodes.append(helper.make_node("Concat", xs, [name], name=name, axis=1))
        self.shapes[name] = (sum(self.shapes[x][0] for x in xs), *heights_widths.pop())
        return name

    def rename_output(self, x: str, name: str) -> str:
        return self._same_shape("Identity", x, name)


# ---------------------------------------------------------------- architectures


def _levi_hassner(net: _Net, x: str, classes: int) -> str:
    """AgeNet / GenderNet: 3 conv + 3 fc, 227x227 input (Levi & Hassner, CVPRW 2015)."""
    x = net.relu(net.conv(x, "conv1", net.width(96), 7, stride=4), "relu1")
    x = net.lrn(net.max_pool(x, "pool1", 3, 2, ceil=True), "norm1")
    x = net.relu(net.conv(x, "conv2", net.width(256), 5, pad=2), "relu2")
    x = net.lrn(net.max_pool(x, "pool2", 3, 2, ceil=True), "norm2")
    x = net.relu(net.conv(x, "conv3", net.width(384, 2), 3, pad=1), "relu3")
    x = net.flatten(net.max_pool(x, "pool5", 3, 2, ceil=True), "flatten")
    x = net.relu(net.gemm(x, "fc6", net.width(512)), "relu6")
    x = net.relu(net.gemm(x, "fc7", net.width(512)), "relu7")
    return net.softmax(net.gemm(x, "fc8", classes), "prob")


def _alexnet_family(net: _Net, x: str, outputs: int, lrn_before_pool: bool,
                    softmax: bool) -> str:
    """AlexNet (LRN then pool) or CaffeNet (pool then LRN): 5 conv + 3 fc, 227x227."""

    def pool_and_norm(y: str, index: int) -> str:
        if lrn_before_pool:
            return net.max_pool(net.lrn(y, f"norm{index}"), f"pool{index}", 3, 2)
        return net.lrn(net.max_pool(y, f"pool{index}", 3, 2), f"norm{index}")

    # Widths feeding a grouped conv stay multiples of its group at every scale.
    x = pool_and_norm(net.relu(net.conv(x, "conv1", net.width(96, 2), 11, stride=4), "relu1"),
                      1)
    x = net.relu(net.conv(x, "conv2", net.width(256, 2), 5, pad=2, group=2), "relu2")
    x = pool_and_norm(x, 2)
    x = net.relu(net.conv(x, "conv3", net.width(384, 2), 3, pad=1), "relu3")
    x = net.relu(net.conv(x, "conv4", net.width(384, 2), 3, pad=1, group=2), "relu4")
    x = net.relu(net.conv(x, "conv5", net.width(256, 2), 3, pad=1, group=2), "relu5")
    x = net.flatten(net.max_pool(x, "pool5", 3, 2), "flatten")
    # FaceNet's original fc6-fc8 are "fc-conv" layers of a fully convolutional net; on a
    # 227x227 input they compute exactly these Gemms, and the paper counts them as fc.
    x = net.relu(net.gemm(x, "fc6", net.width(4096)), "relu6")
    x = net.relu(net.gemm(x, "fc7", net.width(4096)), "relu7")
    x = net.gemm(x, "fc8", outputs)
    return net.softmax(x, "prob") if softmax else net.rename_output(x, "score")


def _vgg_s(net: _Net, x: str, classes: int) -> str:
    """EmotionNet: VGG-S (Chatfield et al. 2014) as used by Levi & Hassner, 224x224."""
    x = net.lrn(net.relu(net.conv(x, "conv1", net.width(96), 7, stride=2), "relu1"), "norm1",
                alpha=5e-4, bias=2.0)
    x = net.max_pool(x, "pool1", 3, 3, ceil=True)
    x = net.relu(net.conv(x, "conv2", net.width(256), 5), "relu2")
    x = net.max_pool(x, "pool2", 2, 2, ceil=True)
    x = net.relu(net.conv(x, "conv3", net.width(512), 3, pad=1), "relu3")
    x = net.relu(net.conv(x, "conv4", net.width(512), 3, pad=1), "relu4")
    x = net.relu(net.conv(x, "conv5", net.width(512), 3, pad=1), "relu5")
    x = net.flatten(net.max_pool(x, "pool5", 3, 3, ceil=True), "flatten")
    x = net.relu(net.gemm(x, "fc6", net.width(4096)), "relu6")
    x = net.relu(net.gemm(x, "fc7", net.width(4096)), "relu7")
    return net.softmax(net.gemm(x, "fc8", classes), "prob")


# (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection) of Szegedy et al. 2015, Table 1.
_INCEPTION: dict[str, tuple[int, int, int, int, int, int]] = {
    "3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128), "5b": (384, 192, 384, 48, 128, 128),
}


def _inception(net: _Net, x: str, block: str) -> str:
    c1, c3r, c3, c5r, c5, cp = (net.width(c) for c in _INCEPTION[block])
    p = f"inception_{block}"
    b1 = net.relu(net.conv(x, f"{p}/1x1", c1, 1), f"{p}/relu_1x1")
    b3 = net.relu(net.conv(x, f"{p}/3x3_reduce", c3r, 1), f"{p}/relu_3x3_reduce")
    b3 = net.relu(net.conv(b3, f"{p}/3x3", c3, 3, pad=1), f"{p}/relu_3x3")
    b5 = net.relu(net.conv(x, f"{p}/5x5_reduce", c5r, 1), f"{p}/relu_5x5_reduce")
    b5 = net.relu(net.conv(b5, f"{p}/5x5", c5, 5, pad=2), f"{p}/relu_5x5")
    bp = net.max_pool(x, f"{p}/pool", 3, 1, pads=(1, 1, 1, 1))
    bp = net.relu(net.conv(bp, f"{p}/pool_proj", cp, 1), f"{p}/relu_pool_proj")
    return net.concat([b1, b3, b5, bp], f"{p}/output")


def _googlenet(net: _Net, x: str, classes: int) -> str:
    """GoogLeNet without the training-only auxiliary heads: 57 conv + 1 fc, 224x224."""
    x = net.relu(net.conv(x, "conv1/7x7_s2", net.width(64), 7, stride=2, pad=3), "conv1/relu")
    x = net.lrn(net.max_pool(x, "pool1/3x3_s2", 3, 2, ceil=True), "pool1/norm1")
    x = net.relu(net.conv(x, "conv2/3x3_reduce", net.width(64), 1), "conv2/relu_reduce")
    x = net.relu(net.conv(x, "conv2/3x3", net.width(192), 3, pad=1), "conv2/relu_3x3")
    x = net.max_pool(net.lrn(x, "conv2/norm2"), "pool2/3x3_s2", 3, 2, ceil=True)
    x = _inception(net, _inception(net, x, "3a"), "3b")
    x = net.max_pool(x, "pool3/3x3_s2", 3, 2, ceil=True)
    for block in ("4a", "4b", "4c", "4d", "4e"):
        x = _inception(net, x, block)
    x = net.max_pool(x, "pool4/3x3_s2", 3, 2, ceil=True)
    x = _inception(net, _inception(net, x, "5a"), "5b")
    x = net.global_avg_pool_flat(x, "pool5/7x7_s1")
    return net.softmax(net.gemm(x, "loss3/classifier", classes), "prob")


def _tiny_yolo_v2(net: _Net, x: str) -> str:
    """Tiny YOLO v2 (VOC): 9 conv, batch norm + leaky ReLU, 416x416 -> 125x13x13."""
    widths = (16, 32, 64, 128, 256, 512, 1024, 1024)
    for index, channels in enumerate(widths, start=1):
        x = net.conv(x, f"conv{index}", net.width(channels), 3, pad=1, bias=False)
        x = net.leaky_relu(net.batch_norm(x, f"conv{index}_bn"), f"relu{index}")
        if index <= 5:
            x = net.max_pool(x, f"pool{index}", 2, 2)
        elif index == 6:
            # Darknet's stride-1 2x2 max pool keeps 13x13 by padding one row and column.
            x = net.max_pool(x, f"pool{index}", 2, 1, pads=(0, 0, 1, 1))
    # 5 anchors x (20 classes + 4 box + 1 objectness) = 125 output channels.
    x = net.conv(x, "conv9", 125, 1)
    return net.rename_output(x, "grid")


_BUILDERS: dict[str, Callable[[_Net, str], str]] = {
    "agenet": lambda net, x: _levi_hassner(net, x, classes=8),
    "gendernet": lambda net, x: _levi_hassner(net, x, classes=2),
    "facenet": lambda net, x: _alexnet_family(net, x, 2, lrn_before_pool=False, softmax=True),
    "sos": lambda net, x: _alexnet_family(net, x, 5, lrn_before_pool=True, softmax=True),
    "googlenet": lambda net, x: _googlenet(net, x, classes=5),
    "tinyyolo": _tiny_yolo_v2,
    "emotionnet": lambda net, x: _vgg_s(net, x, classes=7),
    "memnet": lambda net, x: _alexnet_family(net, x, 1, lrn_before_pool=False, softmax=False),
    "scenenet": lambda net, x: _alexnet_family(net, x, 205, lrn_before_pool=False, softmax=True),
}


def _run_builder(name: str, scale: float, rng: np.random.Generator | None) -> tuple[_Net, str]:
    spec = ZOO_SPECS[check_names([name])[0]]
    net = _Net(check_scale(scale), rng)
    net.shapes["data"] = spec.input_shape[1:]
    output = _BUILDERS[spec.name](net, "data")
    if output != spec.output_name:
        raise AssertionError(f"{name}: builder output {output!r} != {spec.output_name!r}")
    return net, output


def _network_rng(name: str, seed: int) -> np.random.Generator:
    # Mixing in the name gives every network its own stream for the same seed.
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def parameter_count(name: str, scale: float = 1.0) -> int:
    """Number of float32 parameters of a zoo network, without allocating any weight."""
    return _run_builder(name, scale, None)[0].parameter_count


def weight_bytes(name: str, scale: float = 1.0) -> int:
    """Bytes of float32 weights of a zoo network (about its .onnx file size), dry."""
    return parameter_count(name, scale) * FLOAT_BYTES


def layer_counts(name: str, scale: float = 1.0) -> tuple[int, int]:
    """(conv layers, fc layers) as built."""
    net = _run_builder(name, scale, None)[0]
    return net.conv_layers, net.fc_layers


def build_model(name: str, scale: float = 1.0, seed: int = 0) -> onnx.ModelProto:
    """The zoo network `name` with seeded random float32 weights, batch 1, opset 13."""
    spec = ZOO_SPECS[check_names([name])[0]]
    net, output = _run_builder(spec.name, scale, _network_rng(spec.name, seed))
    out_shape = net.shapes[output]
    graph = helper.make_graph(
        net.nodes, spec.name,
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, list(spec.input_shape))],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [1, *out_shape])],
        initializer=net.initializers,
    )
    model = helper.make_model(
        graph, producer_name="masa-zoo", producer_version="1",
        opset_imports=[helper.make_opsetid("", OPSET_VERSION)],
        doc_string=(f"Masa zoo replica of {spec.paper_name} ({spec.architecture}): "
                    "random weights, structure and cost only, not a trained model."),
    )
    model.ir_version = IR_VERSION
    helper.set_model_props(model, {"masa.zoo.name": spec.name, "masa.zoo.scale": repr(scale),
                                   "masa.zoo.seed": str(seed)})
    return model


def save_model(name: str, path: str | Path, scale: float = 1.0, seed: int = 0) -> Path:
    """Build a zoo network and save it as one .onnx file (weights inside)."""
    target = Path(path)
    model = build_model(name, scale, seed)
    onnx.save_model(model, str(target))
    return target


# ---------------------------------------------------------------- the store

SOURCE_NAME = "source.onnx"  # the whole zoo model, kept beside its stages
_STAGING_PREFIX = ".zoo-"


def write_zoo(
    store_dir: str | Path,
    names: Sequence[str] = ZOO_NAMES,
    scale: float = 1.0,
    profile: bool = True,
    seed: int = 0,
    *,
    profile_runs: int | None = None,
    verify: bool = False,
    show_progress: bool | None = False,
    load_mode: str = DEFAULT_LOAD_MODE,
    max_stage_bytes: int = 0,
) -> list[NetworkManifest]:
    """Build zoo networks and prepare each into `store_dir/NAME/` (split, profile).

    Preparation is `model_prep.prepare_cli.prepare_network` (split, optional
    verify against the whole model, optional profile, all in a temporary
    directory, then renamed into place, replacing an earlier version: an error
    or an interrupt leaves the store's networks as they were). The whole model
    is then kept as `NAME/source.onnx` and the manifest's source path names it.
    show_progress: None draws progress bars when stderr is a terminal.
    load_mode: how stage files hold weights ("mmap" or "copy", model_prep.stage_files).
    max_stage_bytes: > 0 slices operators with more weight bytes into several
    stages (`masa prepare --max-stage-bytes`, model_prep.slicing).
    Returns the manifests as loaded (and validated) from their final place, in
    the order of `names` (all nine when empty).
    """
    chosen = check_names(names) if names else list(ZOO_NAMES)
    scale = check_scale(scale)
    store = Path(store_dir)
    ensure_store(store)
    manifests = []
    for name in chosen:
        for stale in store.glob(f"{_STAGING_PREFIX}{name}-*"):
            shutil.rmtree(stale, ignore_errors=True)  # left by an interrupted write_zoo
        try:
            # In the store, so the whole model is renamed (not copied) into place.
            staging = Path(tempfile.mkdtemp(prefix=f"{_STAGING_PREFIX}{name}-", dir=store))
        except OSError as exc:
            raise UserError(f"--store {store}: cannot write the store: "
                            f"{exc.strerror or exc}") from None
        try:
            source = save_model(name, staging / f"{name}.onnx", scale, seed)
            prepared = prepare_network(source, store, name, profile=profile,
                                       profile_runs=profile_runs, verify=verify, seed=seed,
                                       show_progress=show_progress, load_mode=load_mode,
                                       max_stage_weight_bytes=max_stage_bytes)
            network_dir = prepared.manifest.directory
            os.replace(source, network_dir / SOURCE_NAME)
            write_manifest(replace(prepared.manifest,
                                   source_path=str((network_dir / SOURCE_NAME).resolve())),
                           network_dir / MANIFEST_NAME)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        manifests.append(load_manifest(store / name))
        log.info("zoo: wrote %s (%d stages, scale %g, seed %d)", store / name,
                 len(manifests[-1].stages), scale, seed)
    return manifests
