#!/usr/bin/env python3
"""The table of tools/gpu-bench.sh: microtrain's variants and the peers, one row each.

    python3 tools/gpu_bench_summary.py --microtrain RESULTS_JSON [--peers PEERS_JSONL] [--device NAME]

Columns: ms per step (median, p10-p90 where the run recorded steps), tokens/s, MFU counted as
llm.c counts it (6 N + 6 L C T per token, N every parameter: microtrain's own figure for its
rows, the same formula and the same peak for the peers'), peak memory, final loss. The peak is
the one microtrain's results.json used for the precision that ran (its data-sheet entry). A peer
line is one JSON object as bench/torch_gpu_step.py prints it ("impl", "attention", "compile",
"ms_per_step_median", "tokens_per_s", "peak_mem_mib", "final_loss", "B", "T", "preset"); a
missing input leaves its rows out and says so.
"""
import argparse
import json
import os
import statistics
import sys

PRESETS = {  # (n_layer, n_embd, padded vocab, max_seq_len): N as llm.c counts it
    "gpt2-124M": (12, 768, 50304, 1024),
    "gpt2-350M": (24, 1024, 50304, 1024),
    "gpt2-mini": (4, 256, 50304, 256),
    "tiny": (2, 64, 256, 32),
}


def llmc_parameters(L, C, Vp, maxT):
    # wte, wpe, then per block: ln_1, attn (c_attn, c_proj), ln_2, mlp (c_fc, c_proj); ln_f.
    block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C)
    return Vp * C + maxT * C + L * block + 2 * C


def flops_per_token(preset, T):
    L, C, Vp, maxT = PRESETS[preset]
    return 6 * llmc_parameters(L, C, Vp, maxT) + 6 * L * C * T


def microtrain_rows(path):
    j = json.load(open(path))
    rows, peak = [], None
    for v in j["variants"]:
        if v.get("status") != "ok":
            rows.append({"name": f"microtrain `{v['name']}`", "note": f"{v.get('status')}: {v.get('message', '')}"})
            continue
        s = v["stats"]["step_ms"]
        fl = v["flops"]
        peak = peak or fl.get("peak_per_s")
        rows.append({
            "name": f"microtrain `{v['name']}`",
            "ms": f"{s['median']:.2f} ({s['p10']:.2f}–{s['p90']:.2f})",
            "tokens_per_s": v["stats"]["tokens_per_s"],
            "mfu": fl.get("mfu"),
            "mem": v["memory"]["device"].get("peak_used_bytes", 0) / 2**20,
            "loss": v["loss"]["final"],
        })
    calls = {r["variant"]: r for r in j["comparison"]["variants"]}
    for row, v in zip(rows, j["variants"]):
        c = calls.get(v["name"])
        if c and not c.get("is_baseline") and c.get("speedup_ci95"):
            lo, hi = c["speedup_ci95"]
            row["call"] = f"{c.get('time_call')} [{lo:.2f}–{hi:.2f}] vs `{j['comparison']['baseline']}`"
    return rows, peak, j


def peer_rows(path, peak):
    rows = []
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        p = json.loads(line)
        name = f"PyTorch {p.get('torch', '')} {'torch.compile' if p.get('compile') else 'eager'}, {p.get('attention')}"
        tps = p["tokens_per_s"]
        mfu = tps * flops_per_token(p["preset"], p["T"]) / peak if peak else None
        rows.append({"name": name, "ms": f"{p.get('ms_per_step_median', p['ms_per_step_mean']):.2f}",
                     "tokens_per_s": tps, "mfu": mfu, "mem": p.get("peak_mem_mib"),
                     "loss": p.get("final_loss")})
    return rows


def table(rows):
    out = ["| run | ms/step, median (p10–p90) | tokens/s | MFU (llm.c count) | peak memory MiB | final loss | time call |",
           "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "note" in r:
            out.append(f"| {r['name']} | {r['note']} | | | | | |")
            continue
        mfu = f"{100 * r['mfu']:.1f} %" if r.get("mfu") else "n/a"
        mem = f"{r['mem']:.0f}" if r.get("mem") else "n/a"
        loss = f"{r['loss']:.4f}" if r.get("loss") is not None else "n/a"
        out.append(f"| {r['name']} | {r['ms']} | {r['tokens_per_s']:,.0f} | {mfu} | {mem} | {loss} | {r.get('call', '')} |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--microtrain", required=True)
    ap.add_argument("--peers", default="")
    a = ap.parse_args()
    notes = []
    rows, peak, j = [], None, None
    if os.path.exists(a.microtrain):
        rows, peak, j = microtrain_rows(a.microtrain)
    else:
        notes.append(f"no microtrain results at {a.microtrain}")
    if a.peers and os.path.exists(a.peers):
        rows += peer_rows(a.peers, peak)
    elif a.peers:
        notes.append(f"no peer results at {a.peers}")
    print(table(rows))
    if j:
        v = next((v for v in j["variants"] if v.get("status") == "ok"), None)
        if v:
            print(f"\nDevice: {v['device_name']}; peak used for every MFU: "
                  f"{(peak or 0) / 1e12:.1f} TFLOP/s ({v['flops'].get('peak_source', '')}); "
                  f"{j['experiment'].get('rounds', 1)} interleaved rounds for microtrain's variants.")
    for n in notes:
        print(f"\n{n}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
