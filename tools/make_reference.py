#!/usr/bin/python3
"""PyTorch reference fixtures for microtrain's parity tests.

Regenerate every fixture under tests/data with ONE command (from the repository root):

    /usr/bin/python3 tools/make_reference.py

It needs only PyTorch (Debian's python3-torch, 1.13 here); the safetensors format is written and
read by hand (json + struct) so no `safetensors` package is required. Output is deterministic for
a given PyTorch build (fixed seeds, float32, single thread).

For each case it writes three files, in exactly the formats `microtrain step` reads and writes:

  tests/data/<case>_weights.safetensors   the nanoGPT state_dict exactly as PyTorch holds it:
                                          transformer.wte/wpe/h.N.*/ln_f, the tied lm_head.weight
                                          (same values as wte) and the causal-mask buffers
                                          transformer.h.N.attn.bias (1,1,T,T). __metadata__ holds
                                          n_layer, n_head, n_embd, vocab_size, max_seq_len.
                                          wte has exactly vocab_size rows (PyTorch does not pad).
  tests/data/<case>_batch.safetensors     I32 `inputs` and `targets`, shape (B, T).
  tests/data/<case>_expected.safetensors  what `microtrain step --steps 3 ...` must produce:
                                          `loss` F32 [3] (loss before each step), `grad.<name>`
                                          (gradients of the first step) and `<name>` (parameters
                                          after the third step). __metadata__ records the
                                          optimizer hyper-parameters used (lr, beta1, beta2, eps,
                                          weight_decay, grad_clip, steps) and the pre-clip global
                                          gradient norm of each step (grad_norm.<i>).

Cases:
  tiny       L2 C64 H4 T32 V256 (padded vocab 256), batch B=4 T=32, no gradient clipping.
  tiny_v200  L1 C32 H2 T16 V200 (padded vocab 256: microtrain pads wte from 200 to 256 rows),
             batch B=3 T=11 (< max_seq_len), global-norm clipping at 0.5 (active on every step).

The model is nanoGPT's GPT (model.py) with bias=True, dropout 0, the GELU tanh approximation
(as llm.c / GPT-2; nanoGPT's nn.GELU() default is the erf form), LayerNorm eps 1e-5, the LM head
tied to wte, and the explicit causal-mask attention path (register_buffer "bias"). Init is
nanoGPT's (N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), zero biases, unit LayerNorm),
then every bias and LayerNorm parameter is perturbed with small noise so their gradients are not
trivially symmetric (a zero bias or unit gain would hide a transposed or missing term).

The optimizer is torch.optim.AdamW grouped as nanoGPT's configure_optimizers does (weight decay
on parameters with dim >= 2 only), constant LR, no AMSGrad; clipping via clip_grad_norm_.

Everything is float32, like microtrain's CPU backend. The tests' tolerances (stated in
tests/test_parity.cpp) cover float32 reduction-order differences between Eigen and PyTorch.

Also: `/usr/bin/python3 tools/make_reference.py --check-load CKPT.safetensors [--batch X]`
loads a checkpoint written by microtrain into this PyTorch module with load_state_dict(strict=True)
(stripping the padded wte rows, ignoring optim.* tensors) and prints the loss on a batch: the
"ours loads in PyTorch" half of the checkpoint contract.
"""

import argparse
import json
import math
import os
import struct
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- safetensors, by hand -------------------------------------------------------------------

_DTYPES = {torch.float32: "F32", torch.int32: "I32", torch.int64: "I64", torch.float16: "F16",
           torch.bfloat16: "BF16", torch.float64: "F64", torch.uint8: "U8", torch.bool: "BOOL"}
_TORCH = {v: k for k, v in _DTYPES.items()}


def write_safetensors(path, tensors, metadata=None):
    """tensors: ordered dict name -> tensor (any of _DTYPES). Written atomically (temp + fsync +
    rename). Layout: u64 little-endian header length N, N bytes of JSON (padded with spaces to a
    multiple of 8 so the data is aligned, as the reference implementation does), then the raw
    little-endian bytes of each tensor, contiguous, in insertion order."""
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = t.numpy().tobytes() if t.dtype != torch.bfloat16 else \
            t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=os.path.basename(path) + ".tmp.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(hjson)))
            f.write(hjson)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_safetensors(path):
    """Returns (dict name -> tensor, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        dt = _TORCH[e["dtype"]]
        buf = bytearray(data[base + b:base + end])
        if dt == torch.bfloat16:
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16) if buf else \
                torch.empty(0, dtype=dt)
        else:
            t = torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"]).clone()
    return out, meta


# ---- nanoGPT's model (model.py), bias=True, dropout=0, GELU tanh ------------------------------

class Config:
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        self.n_layer, self.n_head, self.n_embd = n_layer, n_head, n_embd
        self.block_size, self.vocab_size = block_size, vocab_size


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=True)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=True)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        # The causal mask nanoGPT registers when flash attention is unavailable; it is part of
        # the state_dict, so microtrain's loader must accept it.
        self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                             .view(1, 1, config.block_size, config.block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = C // self.n_head
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=True)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=True)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=1e-5)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, eps=1e-5),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.size()
        assert T <= self.config.block_size
        pos = torch.arange(0, T, dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def configure_optimizer(self, lr, betas, eps, weight_decay):
        # nanoGPT's configure_optimizers: decay every parameter with dim >= 2 (embeddings and
        # Linear weights), none for biases and LayerNorm parameters. named_parameters() lists
        # the tied wte/lm_head tensor once.
        params = [p for _, p in self.named_parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, foreach=False)


def param_names(model):
    """nanoGPT names of the trainable tensors in state_dict order, wte once (not lm_head)."""
    names = []
    seen = set()
    sd = model.state_dict(keep_vars=True)
    for name, t in sd.items():
        if not isinstance(t, nn.Parameter) or id(t) in seen:
            continue
        seen.add(id(t))
        names.append(name)
    return names


# ---- fixture generation ---------------------------------------------------------------------

def make_case(out_dir, case, cfg, B, T, grad_clip, seed, steps=3, lr=1e-3, betas=(0.9, 0.95),
              eps=1e-8, weight_decay=0.1):
    torch.manual_seed(seed)
    model = GPT(cfg)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if p.dim() == 1:
                if "ln" in name and name.endswith(".weight"):
                    p.add_(0.1 * torch.randn(p.shape, generator=g))   # gains near 1
                else:
                    p.add_(0.02 * torch.randn(p.shape, generator=g))  # biases near 0
    gen = torch.Generator().manual_seed(seed + 2)
    tokens = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=gen)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    meta_cfg = {"n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd,
                "vocab_size": cfg.vocab_size, "max_seq_len": cfg.block_size}
    # The state_dict exactly as PyTorch has it: lm_head.weight (tied) and attn.bias buffers too.
    sd = model.state_dict()
    assert "lm_head.weight" in sd and "transformer.h.0.attn.bias" in sd
    write_safetensors(os.path.join(out_dir, f"{case}_weights.safetensors"), sd,
                      dict(meta_cfg, source="tools/make_reference.py (PyTorch nanoGPT)"))
    write_safetensors(os.path.join(out_dir, f"{case}_batch.safetensors"),
                      {"inputs": inputs.to(torch.int32), "targets": targets.to(torch.int32)})

    names = param_names(model)
    params = dict(model.named_parameters())
    opt = model.configure_optimizer(lr, betas, eps, weight_decay)
    losses, norms, first_grads = [], [], None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(inputs, targets)
        loss.backward()
        losses.append(loss.item())
        if first_grads is None:
            first_grads = {n: params[n].grad.detach().clone() for n in names}
        total = torch.sqrt(sum((params[n].grad.double() ** 2).sum() for n in names)).item()
        norms.append(total)
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_([params[n] for n in names], grad_clip)
        opt.step()

    expected = {"loss": torch.tensor(losses, dtype=torch.float32)}
    for n in names:
        expected["grad." + n] = first_grads[n]
    for n in names:
        expected[n] = params[n].detach()
    meta = dict(meta_cfg, steps=steps, lr=repr(lr), beta1=repr(betas[0]), beta2=repr(betas[1]),
                eps=repr(eps), weight_decay=repr(weight_decay), grad_clip=repr(grad_clip),
                source="tools/make_reference.py (torch %s)" % torch.__version__)
    for i, nrm in enumerate(norms):
        meta[f"grad_norm.{i}"] = repr(nrm)
    write_safetensors(os.path.join(out_dir, f"{case}_expected.safetensors"), expected, meta)
    if grad_clip > 0:
        assert all(nrm > grad_clip for nrm in norms), "clipping must be active on every step"
    print(f"{case}: L{cfg.n_layer} C{cfg.n_embd} H{cfg.n_head} T{cfg.block_size} "
          f"V{cfg.vocab_size}, batch {B}x{T}, clip {grad_clip}: losses "
          + ", ".join(f"{x:.6f}" for x in losses) + "; grad norms "
          + ", ".join(f"{x:.4f}" for x in norms))


def check_load(path, batch_path):
    """Loads a microtrain checkpoint into the PyTorch module strictly and prints its loss."""
    tensors, meta = read_safetensors(path)
    cfg = Config(int(meta["n_layer"]), int(meta["n_head"]), int(meta["n_embd"]),
                 int(meta["max_seq_len"]), int(meta["vocab_size"]))
    model = GPT(cfg)
    sd = {k: v for k, v in tensors.items() if not k.startswith("optim.")}
    wte = sd["transformer.wte.weight"]
    padding = wte[cfg.vocab_size:]
    assert padding.numel() == 0 or padding.abs().max().item() == 0, "padded wte rows not zero"
    sd["transformer.wte.weight"] = wte[:cfg.vocab_size].float()
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    for l in range(cfg.n_layer):  # buffers microtrain does not store
        sd.setdefault(f"transformer.h.{l}.attn.bias", model.state_dict()[f"transformer.h.{l}.attn.bias"])
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    print(f"{path}: loaded strictly into PyTorch nanoGPT ({len(sd)} tensors, "
          f"metadata step={meta.get('step', '-')})")
    if batch_path:
        b, _ = read_safetensors(batch_path)
        with torch.no_grad():
            loss = model(b["inputs"].long(), b["targets"].long())
        print(f"loss on {batch_path}: {loss.item():.6f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "..", "tests", "data"))
    ap.add_argument("--check-load", metavar="CKPT", help="load a microtrain checkpoint strictly")
    ap.add_argument("--batch", metavar="X", help="with --check-load: print the loss on X")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if args.check_load:
        check_load(args.check_load, args.batch)
        return
    os.makedirs(args.out_dir, exist_ok=True)
    make_case(args.out_dir, "tiny", Config(2, 4, 64, 32, 256), B=4, T=32, grad_clip=0.0,
              seed=1337)
    make_case(args.out_dir, "tiny_v200", Config(1, 2, 32, 16, 200), B=3, T=11, grad_clip=0.5,
              seed=2024)


if __name__ == "__main__":
    sys.exit(main())
