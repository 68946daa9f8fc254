#!/usr/bin/env python3
"""GPT-2 training step in PyTorch on the GPU, the peer of `microtrain run bench/gpu_gpt2_124m.yaml`.

    python3 bench/torch_gpu_step.py --preset gpt2-124M -B 8 -T 1024 --precision bf16 \
        --attention sdpa --warmup 3 --steps 10 [--json out.json]

Same model as microtrain: nanoGPT's GPT-2 (pre-LayerNorm, biases, GELU tanh approximation,
LayerNorm eps 1e-5, LM head tied to wte), vocab padded to a multiple of 128 (50304) with the
padding logits excluded from the loss, synthetic uniform tokens, AdamW (lr 6e-4, betas 0.9/0.95,
eps 1e-8, weight decay 0.1 on >= 2-D tensors, the fused CUDA implementation), clip_grad_norm 1.0.
precision: fp32 (TF32 off), tf32 (TF32 matmuls), bf16 (torch.autocast bf16; fp32 master weights,
as microtrain). attention: 'math' (explicit masked softmax, scores materialised, like
microtrain's naive) or 'sdpa' (F.scaled_dot_product_attention: PyTorch's flash kernel).
Each step is timed with CUDA events around forward+backward+optimizer; the loss is read back
after the step. --compile wraps the model in torch.compile (compiled during the warm-up steps,
which must then be enough to cover it: they are not timed). Prints one JSON line: ms per step
(mean, median, min), tokens/s, final loss, peak memory.
"""

import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {  # (n_layer, n_head, n_embd, max_seq_len, vocab_size), as model/gpt.cpp
    "tiny": (2, 4, 64, 32, 256),
    "gpt2-mini": (4, 4, 256, 256, 50257),
    "gpt2-124M": (12, 12, 768, 1024, 50257),
    "gpt2-350M": (24, 16, 1024, 1024, 50257),
}


class Block(nn.Module):
    def __init__(self, C, NH, attention):
        super().__init__()
        self.NH, self.attention = NH, attention
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, NH, C, maxT, V, attention):
        super().__init__()
        self.V, self.Vp = V, (V + 127) // 128 * 128
        self.wte = nn.Embedding(self.Vp, C)
        self.wpe = nn.Embedding(maxT, C)
        self.h = nn.ModuleList(Block(C, NH, attention) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if n.endswith("c_proj.weight") or n.endswith("mlp_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)[..., : self.V]  # padding excluded
        return F.cross_entropy(logits.float().reshape(-1, self.V), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpt2-124M", choices=sorted(PRESETS))
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("-T", type=int, default=1024)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--attention", default="math", choices=["math", "sdpa"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", default="")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (compiled during the warm-up steps, not timed)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_gpu_step: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    torch.manual_seed(1337)
    L, NH, C, maxT, V = PRESETS[a.preset]
    dev = torch.device("cuda")
    model = GPT(L, NH, C, maxT, V, a.attention).to(dev)
    step_model = torch.compile(model) if a.compile else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    g = torch.Generator(device="cpu").manual_seed(1)
    times, loss_v = [], float("nan")
    for step in range(a.warmup + a.steps):
        tok = torch.randint(0, V, (a.B, a.T + 1), generator=g).pin_memory().to(dev, non_blocking=True)
        x, y = tok[:, :-1], tok[:, 1:]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = step_model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        end.record()
        loss_v = loss.item()  # synchronises
        if step >= a.warmup:
            times.append(start.elapsed_time(end))
    mean = sum(times) / len(times)
    res = {
        "impl": "pytorch", "torch": torch.__version__, "device": torch.cuda.get_device_name(0),
        "preset": a.preset, "B": a.B, "T": a.T, "precision": a.precision, "attention": a.attention,
        "compile": a.compile, "ms_per_step_median": statistics.median(times),
        "steps": a.steps, "ms_per_step_mean": mean, "ms_per_step_min": min(times),
        "tokens_per_s": a.B * a.T / (mean / 1e3), "final_loss": loss_v,
        "peak_mem_mib": torch.cuda.max_memory_allocated() / 2**20,
    }
    line = json.dumps(res)
    print(line)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
