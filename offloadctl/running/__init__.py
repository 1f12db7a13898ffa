"""Run: onnxruntime sessions on a device.

`runner` runs a model and reports (`run_model`), and `planned_run` says where a run differs from
what its rewrite was planned for; `sessions` makes its sessions (settings, the device check);
`checks` holds what a run is checked by (the order, the comparison with its original); `placement`
loads plugin providers (WebGPU), reads the copies onnxruntime inserted into the graph it runs, and
replicates CUDA's and CANN's CPU fallback; `residency` finds the nodes a device runs on the host
(`plan --device`); `inputs` reads or generates what a model is fed; `sizes` reads every tensor's
size from one run; `allocator` reads onnxruntime's own memory figures, and `growth` checks a
rewrite's against its original's; `pinned` hands streamed weights to a session from page-locked
memory; `fusions` maps an optimized graph back to the original; `optimize` writes the graph
onnxruntime optimizes for a device, to be planned (``plan --opt-level``); `profiler` measures a
device profile (`offloadctl profile`) with sessions timed side by side (`timed`), the kernel events
of onnxruntime's profiling files (`kernels`), the fitted copy and executor costs (`fits`) and the
copies timed inside the model (`copies_in_model`); `replay` simulates a device run as it ran
(placed as onnxruntime placed it, in the profiled order).
"""
