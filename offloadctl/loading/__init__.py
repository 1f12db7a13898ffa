"""Load: read a model for planning, weights left on disk.

`model` reads the file and checks its external data; `input_shapes` parses ``--input-shape`` and
``--dim`` and pins the dimensions; `tensors` gives every tensor's type, shape and byte size,
lazily, from onnx's shape inference (`inference`, which can run in a child process while the
caller goes on), then onnxruntime's symbolic one (`symbolic`), or from one run (`measured`, the
sizes `offloadctl.running.sizes` reads); `ortgraph` and `inline` change the graph
as onnxruntime does before it runs it, so that positions count what runs; `placed` inserts the copies
onnxruntime adds between host and device where a device provider leaves nodes to the CPU.
"""
