"""A small Llama (or, with ``--arch gpt2``, a GPT-2) exported by torch's dynamo exporter, random
weights, in float32 and float16: a third-party LLM export to check device plans on (its float16 copy
meets the CPU provider's float16 fallback wherever a device leaves a node to the CPU).

Needs torch (CPU build) and transformers, which offloadctl does not depend on; install them in an
environment of their own:

    python -m venv /tmp/export && /tmp/export/bin/pip install torch==2.13.0 transformers onnxscript
    /tmp/export/bin/python bench/export_dynamo_llama.py OUT_FOLDER

writes ``OUT_FOLDER/llama.onnx`` (input ``ids``: int64 [1, seq]) and ``OUT_FOLDER/llama16.onnx``
(``gpt2.onnx`` and ``gpt216.onnx`` with ``--arch gpt2``; the float16 copy made as ``tests/models.py``'s
``to_fp16`` makes one). Then, for example:

    offloadctl plan OUT_FOLDER/llama16.onnx --input-shape ids=1,32 --params --select-distance 10 \\
        --device ascend -o plan.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def export(folder: Path, layers: int = 4, hidden: int = 64, arch: str = "llama") -> tuple[Path, Path]:
    """Export the model into ``folder``: (the float32 file, the float16 file)."""
    import onnx
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "tests"))
    from models import to_fp16

    torch.manual_seed(0)
    if arch == "gpt2":
        gpt2 = GPT2Config(vocab_size=256, n_embd=hidden, n_layer=layers, n_head=4, n_positions=256)
        model = GPT2LMHeadModel(gpt2).eval()
    else:
        config = LlamaConfig(
            vocab_size=256,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        )
        model = LlamaForCausalLM(config).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids, use_cache=False).logits

    folder.mkdir(parents=True, exist_ok=True)
    full, half = folder / f"{arch}.onnx", folder / f"{arch}16.onnx"
    ids = torch.randint(0, 256, (1, 32))
    program = torch.onnx.export(Logits(), (ids,), dynamo=True, dynamic_shapes={"ids": {1: "seq"}})
    program.save(str(full))
    onnx.save(to_fp16(onnx.load(str(full))), half)
    return full, half


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Export a random-weight LLM with torch's dynamo exporter.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--arch", choices=("llama", "gpt2"), default="llama")
    args = parser.parse_args(argv)
    for path in export(args.folder, args.layers, args.hidden, args.arch):
        print(path)


if __name__ == "__main__":
    main()
