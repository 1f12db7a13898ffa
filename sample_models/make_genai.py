"""Build the tiny onnxruntime-genai model folders in ``sample_models/genai`` (random weights, no hub).

A Llama checkpoint with random weights (2 layers, hidden size 64, 4 heads, 2 KV heads, a 256-token
word-level tokenizer made here) is exported by onnxruntime-genai's model builder twice: fp32
(``llama-fp32``) and int4 (``llama-int4``: MatMulNBits weights). The builder uses
GroupQueryAttention with shared past/present KV buffers, as it does for real models.

The builder needs torch, transformers 5 and onnxruntime-genai, which the project does not depend
on; build in a separate environment::

    python -m venv /tmp/genai-build && /tmp/genai-build/bin/pip install torch==2.13.0 \\
        "transformers>=5,<6" onnxruntime-genai==0.18.0 onnx
    /tmp/genai-build/bin/python sample_models/make_genai.py sample_models/genai
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VOCAB = 256


def checkpoint(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=2048,
        bos_token_id=VOCAB - 3,
        eos_token_id=VOCAB - 2,
        tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(config)
    model.eval()
    model.save_pretrained(out)
    words = {f"t{i}": i for i in range(VOCAB - 3)}
    words.update({"<s>": VOCAB - 3, "</s>": VOCAB - 2, "<unk>": VOCAB - 1})
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(
        out
    )


def build(hf: Path, out: Path, precision: str, cache: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "-i",
            str(hf),
            "-o",
            str(out),
            "-p",
            precision,
            "-e",
            "cpu",
            "-c",
            str(cache),
        ],
        check=True,
    )


def main(argv: list[str]) -> None:
    target = Path(argv[1] if len(argv) > 1 else "sample_models/genai")
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf-llama"
        checkpoint(hf)
        for precision in ("fp32", "int4"):
            out = target / f"llama-{precision}"
            if out.exists():
                shutil.rmtree(out)
            build(hf, out, precision, Path(tmp) / "cache")
    print(f"wrote {target}/llama-fp32 and {target}/llama-int4")


if __name__ == "__main__":
    main(sys.argv)
