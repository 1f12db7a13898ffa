"""onnxruntime-genai end to end: greedy generation from a rewritten model folder gives the original's
tokens, and the copies run (their nodes appear in onnxruntime's profile of the genai session).

onnxruntime-genai needs the plain onnxruntime package, so it runs in an environment of its own,
named by OFFLOADCTL_GENAI_PYTHON (`make test-genai` builds it); the rewrite runs here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import LLAMA_DIMS, SAMPLES

pytestmark = pytest.mark.genai

PYTHON = os.environ.get("OFFLOADCTL_GENAI_PYTHON")
GENERATE = """
import json, sys
import onnxruntime_genai as og
model = og.Model(sys.argv[1])
params = og.GeneratorParams(model)
params.set_search_options(max_length=64, do_sample=False)
generator = og.Generator(model, params)
generator.append_tokens([5, 17, 42, 99, 3, 8])
tokens = []
for _ in range(int(sys.argv[2])):
    generator.generate_next_token()
    tokens.append(int(generator.get_next_tokens()[0]))
print(json.dumps(tokens))
"""
DIMS = LLAMA_DIMS


def _generate(folder: Path, count: int = 12) -> list[int]:
    assert PYTHON, "set OFFLOADCTL_GENAI_PYTHON to a Python with onnxruntime-genai (make test-genai)"
    done = subprocess.run([PYTHON, "-c", GENERATE, str(folder), str(count)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _profiled_generation(folder: Path, profiles: Path) -> tuple[list[int], set[str]]:
    """The tokens generated from the rewritten genai ``folder`` with its session profiled (into
    ``profiles``), and the names of the nodes that ran."""
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["enable_profiling"] = str(profiles / "genai_profile")
    (folder / "genai_config.json").write_text(json.dumps(config))
    tokens = _generate(folder)
    (profile,) = profiles.glob("genai_profile*.json")
    events = json.loads(profile.read_text())
    return tokens, {e["name"][: -len("_kernel_time")] for e in events if e.get("cat") == "Node"}


@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_generation_from_the_rewritten_folder_gives_the_same_tokens(run_cli, tmp_path, precision):
    source = SAMPLES / "genai" / f"llama-{precision}"
    plan = tmp_path / "plan.json"
    res = run_cli(
        "plan", source / "model.onnx", *DIMS, "--select-distance", "1", "--params", "--execution-order", "default",
        "-o", plan,
    )  # fmt: skip
    offloads = json.loads(plan.read_text())["offloads"]
    assert offloads, res.stderr
    out = tmp_path / "out"
    out.mkdir()
    res = run_cli("apply", plan, "-o", out / "model.onnx")
    assert res.exit_code == 0, res.stderr
    # profile the genai session, to see the copies run in its DEFAULT order
    tokens, ran = _profiled_generation(out, tmp_path)
    assert tokens == _generate(source)
    copies = {n for n in ran if n.startswith("offload") and not n.startswith("offload/pin/")}
    assert copies, "no copy ran in the onnxruntime-genai session"


def test_a_device_plans_rewrite_generates_the_same_tokens(run_cli, tmp_path):
    """A plan made for a device (``plan --device cuda``: onnxruntime's placement predicted, so the rewrite
    writes the host-to-device copies onnxruntime would insert itself, ``across/...``) generates the
    original's tokens through onnxruntime-genai, and its copies, the across copy among them, run."""
    source = SAMPLES / "genai" / "llama-fp32"
    plan = tmp_path / "plan.json"
    res = run_cli(
        "plan", source / "model.onnx", *DIMS, "--select-distance", "10", "--prefetch-distance", "2", "--params",
        "--device", "cuda", "-o", plan,
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    assert json.loads(plan.read_text())["offloads"], res.stderr
    out = tmp_path / "out"
    out.mkdir()
    res = run_cli("apply", plan, "-o", out / "model.onnx", "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["copies"]["across"] >= 1, res.stdout
    tokens, ran = _profiled_generation(out, tmp_path)
    assert tokens == _generate(source)
    assert any(n.startswith("across/") for n in ran), "the across copy did not run in the genai session"
    assert any(n.startswith("offload") and not n.startswith("offload/pin/") for n in ran), "no offload copy ran"


def test_a_plan_of_the_fused_graph_completes_a_genai_folder_that_generates_the_same_tokens(run_cli, tmp_path):
    """``plan --opt-level all``: the rewrite of onnxruntime's optimized graph becomes a complete genai folder
    (the source folder's files, not its weights file), whose config runs it at ORT_DISABLE_ALL; greedy
    generation gives the original's tokens, and the copies run."""
    source = SAMPLES / "genai" / "llama-fp32"
    plan = tmp_path / "plan.json"
    res = run_cli("plan", source / "model.onnx", *DIMS, "--params", "--budget", "560KiB", "--opt-level", "all",
                  "-o", plan)  # fmt: skip
    assert res.exit_code == 0, res.stderr
    out = tmp_path / "out"
    res = run_cli("apply", plan, "-o", out / "model.onnx")
    assert res.exit_code == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "genai_config.json", "model.onnx", "plan.optimized.onnx.data", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    options = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]["session_options"]
    assert options["graph_optimization_level"] == "ORT_DISABLE_ALL"
    tokens, ran = _profiled_generation(out, tmp_path)
    assert tokens == _generate(source)
    assert any(n.startswith("offload") and not n.startswith("offload/pin/") for n in ran), "no offload copy ran"
