#!/usr/bin/env python3
"""How far flash_tc's bf16 roundings take its results from fp32 attention, in relative L2 norm:
the basis of the norm-wise bounds in tests/cuda/test_cuda_attention_tc.cpp (out 2e-2, each of
the Q, K, V parts of the added gradient 3e-2).

The roundings are the kernels' (kernels/cuda/attention.cu): q, k, v, dout and the initial dqkv
are bf16 on both sides; the GPU rounds P to bf16 before P V and P^T dO, dS before dS K and
dS^T Q, the output when it stores it, and the accumulated dqkv (initial + added) when it stores
it. The test's backward reads the CPU's output rounded to bf16. Everything else is fp32, as the
MMA's accumulators are. Inputs N(0, 1), one head, causal, the test's shapes.

    /path/to/python-with-torch tools/flash_tc_bf16_error.py

Printed on 2026-12-06 (torch 2.15, CPU): out 0.19-0.24 %, dq and dk 0.53-1.01 %, dv 0.33-0.86 %,
growing with T as the gradient shrinks against the values it is added to: the bounds leave a
margin of 3x and more, and an error of a few percent everywhere fails them.
"""
import math

import torch


def bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def relative_errors(T, hs, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do, init = [bf16(torch.randn(T, hs, generator=g)) for _ in range(5)]
    scale = 1 / math.sqrt(hs)
    S = (q @ k.T * scale).masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), -math.inf)
    P = torch.exp(S - torch.logsumexp(S, -1, keepdim=True))
    out = P @ v
    dP = do @ v.T
    dS = P * (dP - (do * out).sum(-1, keepdim=True))
    ref = {"out": out, "dq": dS @ k * scale, "dk": dS.T @ q * scale, "dv": P.T @ do}
    dSg = P * (dP - (do * bf16(out)).sum(-1, keepdim=True))  # the backward's D from bf16 out
    gpu = {"out": bf16(bf16(P) @ v),
           "dq": bf16(init + bf16(dSg) @ k * scale) - init,
           "dk": bf16(init + bf16(dSg).T @ q * scale) - init,
           "dv": bf16(init + bf16(P).T @ do) - init}
    return {n: ((gpu[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref}


def main():
    for T, hs in [(17, 64), (64, 64), (100, 64), (300, 64), (100, 128), (130, 128), (256, 128)]:
        e = relative_errors(T, hs, seed=T * 1000 + hs)
        print(f"T {T:3d} hs {hs:3d}: " + "  ".join(f"{n} {100 * x:.2f} %" for n, x in e.items()))


if __name__ == "__main__":
    main()
