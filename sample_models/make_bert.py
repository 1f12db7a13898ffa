"""Export the tiny BERT sample (sample_models/bert/model.onnx) from a random-weight config.

Needs torch and transformers (not project dependencies): ``pip install torch==2.13.0 'transformers<5'``,
then ``python sample_models/make_bert.py sample_models/bert``. The legacy TorchScript exporter
writes what most BERT exports in the wild look like: Constant-node weights and an int64 mask chain
(token type ids from an Expand of a Constant, the extended attention mask cast to float), which
device providers partly run on the CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(folder: str) -> None:
    import torch
    import transformers

    config = transformers.BertConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 128, (1, 16))
    mask = torch.ones(1, 16, dtype=torch.long)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        model,
        (ids, mask),
        str(out / "model.onnx"),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state", "pooler"],
        opset_version=17,
        dynamo=False,
    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sample_models/bert")
