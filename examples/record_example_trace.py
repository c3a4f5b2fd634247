"""Record the example trace shipped in examples/traces/ (needs ``pip install 'accelrt[torch]'``).

A small Transformer encoder (4 layers, d_model 256, 8 heads, feed-forward 1024) with a
language-model head over a 8,000-token vocabulary, trained for 3 AdamW steps on random tokens,
batch 8 x 128, fp32, on the CPU. Every allocation and free of PyTorch's allocator is recorded
with ``accelrt.trace.record_torch``.

    python examples/record_example_trace.py examples/traces/transformer_train.jsonl.gz
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from accelrt.trace import record_torch

VOCAB, D_MODEL, HEADS, FFN, LAYERS = 8000, 256, 8, 1024, 4
BATCH, SEQ, STEPS = 8, 128, 3


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, FFN, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1])
        return self.head(self.encoder(self.embed(tokens), mask=mask, is_causal=True))


def main(path: str) -> None:
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train() -> None:
        for _ in range(STEPS):
            tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    trace = record_torch(
        train,
        path,
        name="transformer_train",
        workload={
            "model": f"TransformerEncoder LM: {LAYERS} layers, d_model {D_MODEL}, {HEADS} heads, "
            f"ffn {FFN}, vocab {VOCAB}",
            "batch": BATCH,
            "seq_len": SEQ,
            "steps": STEPS,
            "dtype": "float32",
            "optimizer": "AdamW(lr=1e-4)",
            "device": "cpu",
        },
    )
    print(f"{path}: {len(trace.events)} events, peak live {trace.peak_live_bytes} bytes")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples/traces/transformer_train.jsonl.gz")
