"""offloadctl: move idle tensors of an ONNX model to host memory and bring them back before use.

The library is usable without the command line: load a model (`load_model`), analyse it
(`analyse`), run the planning stages (`select`, `filter_plan`, `prefetch`, or `make_plan` for all
three), rewrite it (`offloadctl.apply`), run it (`offloadctl.runner`) or simulate it
(`offloadctl.simulate`).
"""

from __future__ import annotations

__version__ = "0.1.0"

from offloadctl.errors import OffloadError

__all__ = ["OffloadError", "__version__"]
