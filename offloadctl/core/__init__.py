"""What every stage uses: the user-facing error, byte units, file handling (hashes, output guards,
atomic writes), the garbage-collector pause for big structures, the ONNX helpers, the copy
operators (MemcpyToHost/MemcpyFromHost) and the bundled JSON schemas. Nothing here knows a model's
analysis or a plan's meaning.
"""
