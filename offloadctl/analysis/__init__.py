"""Analyse: the read-only view every planning stage works from.

`graph` computes the execution order, producers and uses of a loaded model (`Analysis`); `order`
holds onnxruntime's execution orders (PRIORITY_BASED, and DEFAULT, the one every non-Python host
runs); `timeline` states the memory rules once (where a tensor lives, H2D and release points, the
working set, the lower bound, what If/Loop/Scan bodies hold) for the simulator, the prefetch stage
and the budget planner.
"""
