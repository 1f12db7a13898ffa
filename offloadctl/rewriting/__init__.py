"""Apply: the only code that edits ONNX.

`rewrite` inserts a scheduled plan's copies into its model and writes it next to its data;
`metadata` is the settings record a rewritten model carries for the sessions that run it.
"""
