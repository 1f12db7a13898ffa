"""An onnxruntime-genai model folder, rewritten: the model, its data, the folder's other files and a
``genai_config.json`` whose session options carry what the rewritten model needs.

onnxruntime-genai (a C++ host) cannot set the execution order: the rewritten model's order pins
hold the copies there. What it can carry is in ``genai_config.json``: the ``session_options`` of
the model's section (``model.decoder`` for text models), whose keys onnxruntime-genai does not know
become onnxruntime session config entries. The rewrite needs ConstantFolding off (it would fold
offloaded weights back onto the device and the pins' Shape nodes away): the key
``optimization.disable_specified_optimizers`` (a ``;``-separated list), merged with any the folder
already sets; and, for a ``cann`` provider, ``enable_cann_graph`` 0.

Copying follows the rules for external data: only regular files of the model's own folder, no
symlink followed out of it, nothing written onto an input, modes kept. The file names
``genai_config.json`` holds are input too: one with ``..`` or an absolute path is refused.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from offloadctl.core.errors import OffloadError
from offloadctl.core.files import atomic_write, read_json, same_file
from offloadctl.loading.model import external_data_entries, read_onnx
from offloadctl.rewriting.metadata import SessionSettings

__all__ = ["CONFIG", "GenaiFolder", "check_genai_output", "genai_folder", "write_genai_folder"]

CONFIG = "genai_config.json"
DISABLE_KEY = "optimization.disable_specified_optimizers"


@dataclass(frozen=True)
class GenaiFolder:
    """A model's onnxruntime-genai folder: its config and the section that names the model."""

    folder: Path
    config: dict[str, Any]
    section: str  # "decoder", "encoder", "vision", ... under "model"


def _sections(config: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    model = config.get("model")
    if isinstance(model, dict):
        for name, value in model.items():
            if isinstance(value, dict) and isinstance(value.get("filename"), str):
                yield name, value


def _check_name(name: str, where: str) -> None:
    path = PurePosixPath(name.replace("\\", "/"))
    if not name or path.is_absolute() or ".." in path.parts or (len(name) > 1 and name[1] == ":"):
        raise OffloadError(
            f"{where} names {name!r}, which is not a file of the model's folder",
            hint="names in genai_config.json must be plain file names in that folder (no '..', no absolute paths)",
        )


def genai_folder(model: Path) -> GenaiFolder | None:
    """The onnxruntime-genai folder ``model`` belongs to (its folder holds ``genai_config.json`` and
    a section of it names ``model``), or None.

    Raises:
        OffloadError: the config is not valid JSON, or names a file outside the folder.
    """
    folder = model.parent
    path = folder / CONFIG
    if not path.is_file():
        return None
    config = read_json(path, "onnxruntime-genai config", fix="fix or remove the file", parse_float=float)
    if not isinstance(config, dict):
        raise OffloadError(f"{path} is not a JSON object", hint="fix or remove the file")
    section = None
    for name, value in _sections(config):
        _check_name(value["filename"], f"{path} (model.{name}.filename)")
        if value["filename"] == model.name:
            section = name
    return None if section is None else GenaiFolder(folder, config, section)


def _merged_options(options: dict[str, Any], disabled: list[str], cann: dict[str, str]) -> dict[str, Any]:
    merged = dict(options)
    if disabled:
        have = [x for x in str(merged.get(DISABLE_KEY, "")).split(";") if x]
        merged[DISABLE_KEY] = ";".join(dict.fromkeys([*have, *disabled]))
    providers = merged.get("provider_options")
    if cann and isinstance(providers, list):
        for entry in providers:
            if isinstance(entry, dict) and isinstance(entry.get("cann"), dict):
                for key, value in cann.items():
                    entry["cann"].setdefault(key, value)
    return merged


def _data_files(model: Path) -> set[str]:
    """The names of the files the source model keeps its weights in: the rewrite writes its own."""
    if not model.is_file():
        return set()
    return {Path(location).name for _, location in external_data_entries(read_onnx(model))}


def _folder_files(folder: Path, skip: set[str]) -> list[Path]:
    """The regular files of ``folder`` to copy (top level; symlinks only to files inside it)."""
    found = []
    root = folder.resolve()
    for entry in sorted(folder.iterdir()):
        if entry.name in skip or entry.name == CONFIG:
            continue
        if entry.is_symlink() and not entry.resolve().is_relative_to(root):
            raise OffloadError(
                f"{entry} is a symlink to a file outside the model's folder {folder}",
                hint="copy the file into the folder, or remove the link",
            )
        if entry.is_file():
            found.append(entry)
    return found


def check_genai_output(source: GenaiFolder, output: Path) -> None:
    """Refuse an output in the source's own folder: its config would be overwritten."""
    if output.parent.resolve() == source.folder.resolve():
        raise OffloadError(
            f"{output} is in the model's onnxruntime-genai folder {source.folder}, whose {CONFIG} would be overwritten",
            hint="write the rewritten model into another folder (offloadctl apply PLAN -o OUT/model.onnx): it becomes "
            "a complete onnxruntime-genai folder",
        )


def _config_for(source: GenaiFolder, output: Path, settings: SessionSettings) -> dict[str, Any]:
    """The source's genai config naming ``output``, with the session options the rewrite needs
    (``settings``: its ``offloadctl.session`` record)."""
    config = json.loads(json.dumps(source.config))
    section = config["model"][source.section]
    section["filename"] = output.name
    disabled = [str(x) for x in settings.get("disabled_optimizers") or []]
    cann = {str(k): str(v) for k, v in (settings.get("cann") or {}).items()}
    options = section.get("session_options") if isinstance(section.get("session_options"), dict) else {}
    section["session_options"] = _merged_options(options, disabled, cann)
    if settings.get("graph_optimization_level"):  # the graph is optimized already (plan --opt-level)
        section["session_options"]["graph_optimization_level"] = str(settings["graph_optimization_level"])
    return config


def write_genai_folder(
    source: GenaiFolder,
    output: Path,
    settings: SessionSettings,
    *,
    written: list[Path],
    protected: tuple[Path, ...] = (),
) -> list[Path]:
    """Complete ``output``'s folder as an onnxruntime-genai folder: the source folder's other files
    and its config naming ``output`` with the session options the rewritten model needs
    (``settings``: its ``offloadctl.session`` record). ``written``: files the rewrite wrote there
    already (the model, its data). Returns the files written here; nothing is left half-written.

    Raises:
        OffloadError: the output folder is the source folder (its config would be overwritten), a
            file to write exists and differs, or a file to copy is not in the source folder.
    """
    out_dir = output.parent
    check_genai_output(source, output)
    model = source.config["model"][source.section]["filename"]
    skip = {p.name for p in written} | {output.name, model} | _data_files(source.folder / model)
    created: list[Path] = []
    try:
        for src in _folder_files(source.folder, skip):
            dst = out_dir / src.name
            if any(same_file(dst, p) for p in protected if p.exists()):
                raise OffloadError(f"{dst} is a file the rewrite reads", hint="write into another folder")
            if dst.exists():
                if dst.read_bytes() == src.read_bytes():
                    continue
                raise OffloadError(
                    f"{dst} already exists and differs from {src}",
                    hint="write into an empty folder, or remove the file",
                )
            atomic_write(dst, functools.partial(shutil.copyfile, src), mode=stat.S_IMODE(src.stat().st_mode))
            created.append(dst)
        target = out_dir / CONFIG
        mode = stat.S_IMODE((source.folder / CONFIG).stat().st_mode)
        text = json.dumps(_config_for(source, output, settings), indent=4) + "\n"
        atomic_write(target, lambda tmp: tmp.write_text(text, encoding="utf-8"), mode=mode)
        created.append(target)
    except BaseException:
        for path in created:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise
    return created
