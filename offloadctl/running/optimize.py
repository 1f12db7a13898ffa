"""The graph onnxruntime runs at an optimization level, written out to be planned (``plan --opt-level``).

A plan of the model as exported counts nodes onnxruntime fuses at ``basic``, ``extended`` or ``all``:
at those levels its partition file would name nodes the session no longer has, and its copies would
undo the fusions. `optimized_model` lets onnxruntime optimize the model itself (``optimized_model_filepath``,
CPU provider), for the device the plan is made for, and writes the result beside the plan; the plan and
its rewrite are of that graph, which then runs at ``disable`` (the rewrite's metadata says so, and
``run`` holds to it).

The CPU provider makes some fusions no other provider has kernels for (``graph_transformer_utils.cc``):
for ``--device cuda`` (and WebGPU) they are turned off (`CPU_ONLY`); CANN runs standard operators only,
so ``--device ascend`` gets ``basic`` at most (constant folding, eliminations, Conv+BatchNormalization
and the like, no com.microsoft operators). `OptimizedModel` says which level was made and why.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from offloadctl.core.errors import OffloadError
from offloadctl.core.files import atomic_write, sha256_file
from offloadctl.core.plantypes import OptimizedRecord
from offloadctl.loading.model import external_data_entries, read_onnx
from offloadctl.running.sessions import OPT_LEVELS, import_onnxruntime

__all__ = ["CPU_ONLY", "OptimizedModel", "optimized_model", "optimized_outputs", "optimized_path"]

#: onnxruntime's graph transformers that only the CPU provider (and a few others, never CUDA) has kernels for
CPU_ONLY = (
    "GemmActivationFusion",
    "ConvActivationFusion",
    "ConvAddActivationFusion",
    "NchwcTransformer",
    "NhwcTransformer",
    "DynamicQuantizeMatMulFusion",
    "MatMulIntegerToFloatFusion",
    "MatMulNBitsFusion",
    "QDQS8ToU8Transformer",
    "QDQSelectorActionTransformer",
    "Avx2WeightS8ToU8Transformer",
    "FuseFp16InitializerToFp32NodeTransformer",  # float16 weights made float32 for the CPU's Casts: twice the bytes
)
#: the highest level each device's provider has the kernels of
_HIGHEST = {"ascend": "basic"}
_ORDER = list(OPT_LEVELS)


@dataclass(frozen=True)
class OptimizedModel:
    """The model onnxruntime optimized (``path``) and from what (``source``, its sha256), at ``level`` for
    ``device`` (None: the CPU provider's own graph), with the transformers turned off; ``why``, when the
    level made is not the one asked for."""

    path: Path
    source: str
    source_sha256: str
    level: str
    device: str | None
    disabled: tuple[str, ...] = ()
    why: str | None = None
    data_files: list[Path] = field(default_factory=list)

    def to_json(self) -> OptimizedRecord:
        """What a plan records of it (``model.optimized``)."""
        return {
            "from": self.source,
            "sha256": self.source_sha256,
            "opt_level": self.level,
            "device": self.device,
            "disabled_optimizers": list(self.disabled),
        }


def optimized_path(plan_path: str | os.PathLike[str]) -> Path:
    """Where ``plan --opt-level`` writes the optimized model: beside the plan, ``PLAN.optimized.onnx``."""
    path = Path(plan_path)
    return path.with_name(f"{path.stem}.optimized.onnx")


def optimized_outputs(plan_path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """The files ``plan --opt-level`` may write beside the plan: the optimized model and its weights file."""
    path = optimized_path(plan_path)
    return path, path.with_name(f"{path.name}.data")


def optimized_model(
    model: str | os.PathLike[str], out: str | os.PathLike[str], level: str, device: str | None = None
) -> OptimizedModel:
    """Let onnxruntime optimize ``model`` at ``level`` for ``device`` and write the graph it runs to ``out``
    (atomically; weights over 1 KiB in ``OUT.data`` beside it when the source keeps its weights in external
    data). The session is made on the CPU provider, with `CPU_ONLY` turned off for another device.

    Raises:
        OffloadError: an unknown level, onnxruntime missing, or a model it refuses.
    """
    if level not in OPT_LEVELS or level == "disable":
        raise OffloadError(f"cannot optimize at level {level!r}", hint="give basic, extended or all")
    made, why = level, None
    highest = _HIGHEST.get(device or "")
    if highest is not None and _ORDER.index(level) > _ORDER.index(highest):
        made = highest
        why = f"{device} runs standard operators only: the fusions above {highest} make com.microsoft ones"
    disabled = CPU_ONLY if device in ("cuda", "webgpu") else ()
    ort = import_onnxruntime("cpu")
    out = Path(out)
    external = _has_external_data(Path(model))
    with tempfile.TemporaryDirectory(prefix="offloadctl-optimize-", dir=out.parent) as folder:
        tmp = Path(folder) / out.name
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[made])
        so.optimized_model_filepath = str(tmp)
        so.log_severity_level = 3  # (the NCHWc layout's note that the file is for this machine)
        if external:
            so.add_session_config_entry("session.optimized_model_external_initializers_file_name", f"{out.name}.data")
            so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        try:
            ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled))
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises several types for a model it refuses
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OffloadError(
                f"onnxruntime could not optimize {model} at {made}: {first}", hint="plan without --opt-level"
            ) from None
        data_files = []
        if external and (Path(folder) / f"{out.name}.data").exists():
            data = out.with_name(f"{out.name}.data")
            atomic_write(data, lambda t: os.replace(Path(folder) / f"{out.name}.data", t))
            data_files.append(data)
        atomic_write(out, lambda t: os.replace(tmp, t))
    return OptimizedModel(out, str(model), sha256_file(model), made, device, tuple(disabled), why, data_files)


def _has_external_data(path: Path) -> bool:
    """True when the model at ``path`` keeps weights in files of their own (a missing, empty or corrupt
    model is refused here, by one clear error, before onnxruntime reads it)."""
    return any(True for _ in external_data_entries(read_onnx(path)))
