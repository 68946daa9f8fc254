#!/usr/bin/python3
"""PyTorch eager's CPU training step, timed the way bench/cpu_step.cpp times microtrain's.

    /work/pyenv/bin/python bench/torch_cpu_step.py --preset gpt2-mini -B 4 -T 256 --threads 2 \
        --warmup 2 --steps 5 [--json out.json] [--probe]

Any PyTorch from 1.13 on: the PyPI wheel of 2.x (BLAS = MKL, statically linked, plus oneDNN)
or Debian's python3-torch 1.13 (BLAS = the system's libblas, which must be OpenBLAS: the
reference BLAS would make the comparison meaningless, so the script refuses it).

Which CPU ISA it ran goes into the JSON ("isa"): torch.backends.cpu.get_cpu_capability() (ATen's
own vectorised kernels: DEFAULT, AVX2, AVX512), the build's BLAS (torch.__config__) and the ISA
limits of the environment (MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY:
bench/run_cpu_bench.sh sets all three to AVX2 for its "PyTorch limited to AVX2" row).

The model is nanoGPT's GPT (model.py, its PyTorch 1.13 path on every version, so every version runs
the same ops: the explicit causal-mask attention, no flash kernel) with bias=True, dropout 0, the
GELU tanh approximation, LayerNorm eps 1e-5, the LM head tied to wte, and the real GPT-2 vocabulary
of 50257 (PyTorch does not pad; microtrain pads wte to 50304 rows but excludes the padding from the
softmax). Init as nanoGPT. The optimizer is torch.optim.AdamW grouped as nanoGPT's
configure_optimizers (weight decay on tensors with dim >= 2), lr 3e-4, betas (0.9, 0.95), eps 1e-8,
weight decay 0.1, the version's default implementation on the CPU (single-tensor: foreach and fused
default off for CPU tensors; the JSON records both as the optimizer holds them, None = that
default), and clip_grad_norm_(1.0). Everything float32.

Phases (the same cut as cpu_step):
  forward   = logits, loss = model(x, y); loss.item()
  backward  = optimizer.zero_grad(set_to_none=True); loss.backward()
  optimizer = clip_grad_norm_(params, 1.0); optimizer.step()
each timed with time.perf_counter (CPU ops are synchronous).

--turn-in/--turn-out FIFO: lockstep with a peer process, step by step (bench/turns.py states the
protocol; bench/cpu_lockstep.py drives it). Every step's start and end on CLOCK_MONOTONIC go into
the JSON (step_spans_ms) either way.

Model FLOPs per step use microtrain's formula (GPT::training_flops_per_step, llm.c's count):
6 N + 6 L C T per token, times B*T, N every parameter of microtrain's model (PyTorch's plus the
vocabulary padding rows microtrain's wte has), so both sides divide the same work.

--probe, after the steps and with the same threads: torch.mm 1024x1024x1024 and the LM head's shape
((B*T, C) x (C, V)), median of 5 after 1 warm-up (the BLAS's sgemm: MKL's or OpenBLAS's), and a 256
MiB tensor copy (GB/s counting read + write). Peak RSS (ru_maxrss) is read before the probes.
"""

import argparse
import json
import math
import os
import re
import resource
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from turns import Turns, monotonic_ms

PRESETS = {  # (n_layer, n_head, n_embd, max_seq_len, vocab_size): model/gpt.cpp's presets
    "tiny": (2, 4, 64, 32, 256),
    "gpt2-mini": (4, 4, 256, 256, 50257),
    "gpt2-124M": (12, 12, 768, 1024, 50257),
    "gpt2-350M": (24, 16, 1024, 1024, 50257),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, C, NH, maxT):
        super().__init__()
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.n_head = NH
        self.register_buffer("bias", torch.tril(torch.ones(maxT, maxT)).view(1, 1, maxT, maxT))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        hs = C // self.n_head
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, C, NH, maxT):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = CausalSelfAttention(C, NH, maxT)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, L, NH, C, maxT, V):
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(V, C),
                wpe=nn.Embedding(maxT, C),
                h=nn.ModuleList([Block(C, NH, maxT) for _ in range(L)]),
                ln_f=nn.LayerNorm(C, eps=1e-5),
            )
        )
        self.lm_head = nn.Linear(C, V, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * L))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


ISA_LIMITS = ("MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")


def build_setting(name):
    """A value of torch.__config__'s "Build settings" (e.g. BLAS_INFO=mkl), or None."""
    m = re.search(rf"\b{name}=([^,\s]+)", torch.__config__.show())
    return m.group(1) if m else None


def blas_library():
    """The BLAS shared object this process mapped (after a matmul), or None."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "blas" in os.path.basename(path):
                libs.add(path)
    for p in sorted(libs):
        if "openblas" in p:
            return p
    return sorted(libs)[0] if libs else None


def blas_name():
    """'mkl' (linked into libtorch), or the OpenBLAS library this process mapped; exits with how
    to fix it when PyTorch runs neither (the reference BLAS is tens of times slower)."""
    if build_setting("BLAS_INFO") == "mkl":
        return "mkl"
    blas = blas_library()
    if blas is None or "openblas" not in blas:
        sys.exit(
            f"torch_cpu_step: PyTorch {torch.__version__} uses neither MKL nor OpenBLAS (BLAS "
            f"mapped: {blas}); the reference BLAS would make this comparison meaningless. Fix: "
            "use the PyPI wheel (MT_BENCH_PYTHON=/work/pyenv/bin/python), or bash tools/setup.sh "
            "--torch (installs libopenblas0-openmp) and check `update-alternatives --display "
            "libblas.so.3-x86_64-linux-gnu` points at openblas")
    return blas


def isa_record(blas):
    """Which ISA this process's kernels use, as PyTorch and the environment say."""
    rec = {"cpu_capability": torch.backends.cpu.get_cpu_capability()
           if hasattr(torch.backends, "cpu") else "unknown (PyTorch < 2.0)",
           "blas": blas, "blas_info": build_setting("BLAS_INFO"),
           "mkldnn": torch.backends.mkldnn.is_available(),
           "env": {k: os.environ.get(k) for k in ISA_LIMITS}}
    rec["build"] = [line.strip("- ").strip() for line in torch.__config__.show().splitlines()
                    if "Math Kernel" in line or "MKL-DNN" in line or "CPU capability" in line]
    return rec


def median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def series(v):
    return {"median": median(v), "min": min(v), "max": max(v), "all": v}


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def time_ms(fn, reps):
    fn()  # warm-up
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return median(out)


def write_atomically(path, text):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".torch_cpu_step.", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", required=True, choices=sorted(PRESETS))
    ap.add_argument("-B", "--batch", type=int, default=4)
    ap.add_argument("-T", "--seq-len", type=int, default=0, help="default: the preset's max")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--json", default="", help="write the results as JSON here (atomically)")
    ap.add_argument("--probe", action="store_true", help="sgemm and copy probes after the steps")
    ap.add_argument("--turn-in", default="", help="FIFO to read this process's turn from before "
                    "each step (lockstep with a peer: bench/cpu_lockstep.py)")
    ap.add_argument("--turn-out", default="", help="FIFO to pass the turn through after each step")
    ap.add_argument("--turn-settle-ms", type=int, default=100,
                    help="wait after getting the turn, before the step (the peer's threads go idle)")
    a = ap.parse_args()

    L, NH, C, maxT, V = PRESETS[a.preset]
    B, T = a.batch, a.seq_len or maxT
    for name, val, lo in (("-B", B, 1), ("-T", T, 1), ("--threads", a.threads, 1),
                          ("--steps", a.steps, 1), ("--warmup", a.warmup, 0)):
        if val < lo:
            ap.error(f"{name} must be >= {lo}, got {val}")
    if T > maxT:
        ap.error(f"-T {T} exceeds max_seq_len {maxT} of preset '{a.preset}'; use -T <= {maxT}")
    if bool(a.turn_in) != bool(a.turn_out):
        ap.error("--turn-in and --turn-out go together")
    if not 0 <= a.turn_settle_ms <= 10000:
        ap.error(f"--turn-settle-ms must be in [0, 10000], got {a.turn_settle_ms}")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    torch.mm(torch.ones(64, 64), torch.ones(64, 64))  # loads the BLAS
    blas = blas_name()
    isa = isa_record(blas)

    model = GPT(L, NH, C, maxT, V)
    model.train()
    params = [p for p in model.parameters()]  # tied wte/lm_head counted once
    nparams = sum(p.numel() for p in params)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    foreach, fused = opt.defaults.get("foreach"), opt.defaults.get("fused")

    g = torch.Generator().manual_seed(a.seed)
    tokens = torch.randint(0, V, (B * T + 1,), generator=g, dtype=torch.long)
    x = tokens[:-1].view(B, T).clone()
    y = tokens[1:].view(B, T).clone()

    # microtrain's GPT::training_flops_per_step (llm.c's gpt2_estimate_mfu): 6 FLOPs per parameter
    # and token, N counting wte's rows padded to a multiple of 128 as microtrain stores them, plus
    # 6 L C T per token for the attention scores and values (forward 2, backward 4).
    padded_V = (V + 127) // 128 * 128
    flops = (6.0 * (nparams + (padded_V - V) * C) + 6.0 * L * C * T) * B * T

    print(f"torch_cpu_step: PyTorch {torch.__version__} {a.preset} (L{L} C{C} H{NH} T{maxT} "
          f"V{V}), {nparams} params, B={B} T={T}, {torch.get_num_threads()} threads, BLAS {blas}, "
          f"CPU capability {isa['cpu_capability']}")
    turns = Turns(a.turn_in, a.turn_out, a.turn_settle_ms) if a.turn_in else None
    fwd, bwd, optm, step, losses, spans = [], [], [], [], [], []
    for s in range(a.warmup + a.steps):
        if turns:
            turns.wait_for_turn()
        span_start = monotonic_ms()
        t0 = time.perf_counter()
        _, loss = model(x, y)
        lv = loss.item()
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t2 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        t3 = time.perf_counter()
        spans.append([span_start, monotonic_ms()])
        if turns:
            turns.pass_turn()
        if not math.isfinite(lv):
            sys.exit(f"torch_cpu_step: loss is not finite ({lv}) at step {s + 1}")
        ms = [(t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3]
        measured = s >= a.warmup
        print(f"  step {s + 1:2d} {'' if measured else 'warmup':7s} loss {lv:.4f}  {ms[3]:9.1f} ms "
              f"(fwd {ms[0]:.1f} bwd {ms[1]:.1f} opt {ms[2]:.1f})", flush=True)
        losses.append(lv)
        if measured:
            fwd.append(ms[0]); bwd.append(ms[1]); optm.append(ms[2]); step.append(ms[3])
    rss = peak_rss_mib()
    step_ms = median(step)
    gflops = flops / (step_ms * 1e-3) / 1e9
    out = {
        "impl": "pytorch",
        "torch_version": torch.__version__,
        "blas": blas,
        "isa": isa,
        "adamw": {"foreach": foreach, "fused": fused},
        "preset": a.preset,
        "model": {"n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V,
                  "padded_vocab_size": V, "max_seq_len": maxT, "params": nparams},
        "B": B, "T": T, "threads": a.threads, "warmup": a.warmup, "steps": a.steps,
        "step_ms": series(step), "forward_ms": series(fwd), "backward_ms": series(bwd),
        "optimizer_ms": series(optm),
        "tokens_per_s": B * T / (step_ms * 1e-3),
        "flops_per_step": flops, "gflops": gflops, "peak_rss_mib": rss, "losses": losses,
        "step_spans_ms": spans,
        "lockstep": ({"turn_in": a.turn_in, "turn_out": a.turn_out,
                      "settle_ms": a.turn_settle_ms} if turns else None),
    }
    print(f"  median step {step_ms:.1f} ms  (forward {median(fwd):.1f}, backward "
          f"{median(bwd):.1f}, optimizer {median(optm):.1f})")
    print(f"  {B * T / (step_ms * 1e-3):.0f} tokens/s, {flops / 1e9:.3f} GFLOP/step, "
          f"{gflops:.1f} GFLOP/s, peak RSS {rss:.0f} MiB")

    if a.probe:
        del model, opt, params, decay, no_decay, loss
        with torch.no_grad():
            gen = torch.Generator().manual_seed(7)
            sq_a = torch.rand(1024, 1024, generator=gen) * 2 - 1
            sq_b = torch.rand(1024, 1024, generator=gen) * 2 - 1
            sq = 2.0 * 1024 ** 3 / (time_ms(lambda: torch.mm(sq_a, sq_b), 5) * 1e-3) / 1e9
            la = torch.rand(B * T, C, generator=gen) * 2 - 1
            lw = torch.rand(V, C, generator=gen) * 2 - 1
            lm = 2.0 * B * T * C * V / (time_ms(lambda: torch.mm(la, lw.t()), 5) * 1e-3) / 1e9
            n = (256 << 20) // 4
            src = torch.ones(n)
            dst = torch.zeros(n)
            cp = 2.0 * n * 4 / (time_ms(lambda: dst.copy_(src), 5) * 1e-3) / 1e9
        out["probe"] = {"sgemm_impl": f"torch.mm ({os.path.basename(blas)})",
                        "sgemm_1024_gflops": sq, "sgemm_model_gflops": lm,
                        "sgemm_model_shape": [B * T, C, V], "copy_gbps": cp, "copy_mib": 256}
        print(f"  probe: sgemm 1024^3 {sq:.1f} GFLOP/s, sgemm {B * T}x{C}x{V} (LM head) "
              f"{lm:.1f} GFLOP/s, copy {cp:.1f} GB/s (read+write); step reaches "
              f"{100 * gflops / sq:.0f}% of the 1024^3 probe")
    if a.json:
        write_atomically(a.json, json.dumps(out, indent=2, sort_keys=True) + "\n")
        print(f"  wrote {a.json}")


if __name__ == "__main__":
    main()
