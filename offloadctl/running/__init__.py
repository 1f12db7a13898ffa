"""Run: onnxruntime sessions on a device.

`runner` runs a model (settings, the device check, the order check, the comparison with its
original); `inputs` reads or generates what a model is fed; `sizes` reads every tensor's size from
one run; `profiler` measures a device profile (`offloadctl profile`).
"""
