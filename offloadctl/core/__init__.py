"""What every stage uses. `errors` (the user-facing `OffloadError`), `units` (byte units),
`files` (hashes, output guards, atomic writes), `bulk` (the garbage-collector pause for big
structures), `ahead` (work done in a forked child while the caller goes on), `onnxutil` (ONNX
helpers), `memcpy` (the copy operators MemcpyToHost/MemcpyFromHost), `schemas` (the bundled JSON
schemas), `plantypes` (the plan document as typed dicts) and `terms` (the command line's options
said as the Python API's keywords). Nothing here knows a model's analysis
or a plan's meaning.
"""
