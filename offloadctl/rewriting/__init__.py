"""Apply: the only code that edits ONNX.

`rewrite` inserts a scheduled plan's copies and order pins into its model, and `writing` writes it
next to its data; `modes` says which copy mode a rewrite is written in (the plan's, or the one asked
for) and which device its plan was made for; `metadata` is the settings record a rewritten model
carries for the sessions that run it; `genai` writes a complete onnxruntime-genai folder around a
rewrite; `preview` builds the rewrite in memory to read its figures as it will run (the CPU arena's,
and the device peak of the DEFAULT walk over the rewrite), and `figures` turns those into the peaks
and time a plan quotes; `streams` adds the event nodes and the partition file that put the copies
on a stream of their own (``apply --copies streams``), `on_streams` decides, rewrite by rewrite,
whether they go there or in line, and `guards` finds where onnxruntime's
multi-stream planner would let a node overwrite a buffer others still read and guards it.
"""
