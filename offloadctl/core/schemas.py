"""The JSON schemas offloadctl ships (``schemas/`` in a checkout, ``offloadctl/_schemas`` when installed)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["load_schema"]

# offloadctl/core/schemas.py -> the checkout's top folder
_SOURCE = Path(__file__).resolve().parents[2] / "schemas"


@cache
def load_schema(name: str) -> dict[str, Any]:
    """The schema ``name`` (e.g. ``plan.schema.json``), from the installed package or, in a source
    checkout, from ``schemas/``."""
    packaged = resources.files("offloadctl") / "_schemas" / name
    if packaged.is_file():
        return json.loads(packaged.read_text(encoding="utf-8"))
    return json.loads((_SOURCE / name).read_text(encoding="utf-8"))
