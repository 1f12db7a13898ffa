"""Load: read a model for planning, weights left on disk.

`model` reads the file, checks its external data and pins dynamic dimensions (`pins` parses
``--input-shape`` and ``--dim``); `tensors` gives every tensor's type, shape and byte size, lazily,
from onnx's shape inference, then onnxruntime's symbolic one (`symbolic`), or from one run
(`offloadctl.running.sizes`); `ortgraph` and `inline` change the graph as onnxruntime does before
it runs it, so that positions count what runs.
"""
