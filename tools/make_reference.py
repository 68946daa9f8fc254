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
  tiny_lora  L2 C32 H2 T16 V200 with LoRA rank 4, alpha 8 on attn.c_attn, mlp.c_fc and
             mlp.c_proj (attn.c_proj plain), batch B=3 T=16, no clipping. LoRALinear below is
             peft's definition written out: y = x W^T + b + (alpha/r) (x A^T) B^T, A (r, in)
             Kaiming-uniform, B (out, r) zero at init, here then set to N(0, 0.05^2) so A's
             gradient is not zero. The base is frozen (requires_grad False) and AdamW runs over
             the adapters only (both decayed: dim 2). The weights file holds the adapters as
             <linear>.lora_A.weight / lora_B.weight and __metadata__ lora_rank, lora_alpha,
             lora_targets; the expected file has grad.<name> for the adapters only.
  tiny_freeze  L2 C32 H2 T16 V200 with wte (so the tied LM head), wpe and block 0 frozen
             (optim.freeze [wte, wpe, h.0], recorded in the expected file's __metadata__
             "freeze"), batch B=3 T=16, clipping at 0.05 over the tensors that train.

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
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size, lora_rank=0,
                 lora_alpha=1.0, lora_targets=()):
        self.n_layer, self.n_head, self.n_embd = n_layer, n_head, n_embd
        self.block_size, self.vocab_size = block_size, vocab_size
        # LoRA on the named Linears of every block ("attn.c_attn", "attn.c_proj", "mlp.c_fc",
        # "mlp.c_proj"); rank 0: plain nanoGPT.
        self.lora_rank, self.lora_alpha, self.lora_targets = lora_rank, lora_alpha, lora_targets


class LoRALinear(nn.Linear):
    """A Linear with a LoRA adapter (Hu et al. 2021; as peft's lora.Linear):
    y = x W^T + b + (alpha/r) (x A^T) B^T, A (r, in_features), B (out_features, r), the adapter
    modules named lora_A / lora_B so the state_dict holds <linear>.lora_A.weight and
    <linear>.lora_B.weight. Init as peft: A Kaiming-uniform (a = sqrt(5), nn.Linear's default),
    B zero, so the adapted model starts as the base."""

    def __init__(self, in_features, out_features, r, alpha):
        super().__init__(in_features, out_features, bias=True)
        self.lora_A = nn.Linear(in_features, r, bias=False)
        self.lora_B = nn.Linear(r, out_features, bias=False)
        self.scaling = alpha / r

    def reset_lora(self):
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias) + self.lora_B(self.lora_A(x)) * self.scaling


def linear(config, name, in_features, out_features):
    """nn.Linear, or a LoRALinear when config adapts `name` ("attn.c_attn", ...)."""
    if config.lora_rank > 0 and name in config.lora_targets:
        return LoRALinear(in_features, out_features, config.lora_rank, config.lora_alpha)
    return nn.Linear(in_features, out_features, bias=True)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = linear(config, "attn.c_attn", config.n_embd, 3 * config.n_embd)
        self.c_proj = linear(config, "attn.c_proj", config.n_embd, config.n_embd)
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
        self.c_fc = linear(config, "mlp.c_fc", config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = linear(config, "mlp.c_proj", 4 * config.n_embd, config.n_embd)

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
        for m in self.modules():  # after _init_weights, which also visits lora_A / lora_B
            if isinstance(m, LoRALinear):
                m.reset_lora()

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

LORA_TARGET_ORDER = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def freeze_parameters(model, cfg, freeze):
    """What trains: with LoRA only the adapters (the base is frozen: requires_grad False); with
    `freeze` (optim.freeze's names or prefixes, "wte", "h.0", ...) all but the named tensors."""
    for name, p in model.named_parameters():
        if cfg.lora_rank > 0 and ".lora_" not in name:
            p.requires_grad_(False)
        for entry in freeze:
            full = entry if entry.startswith("transformer.") else "transformer." + entry
            if name == full or name.startswith(full + "."):
                p.requires_grad_(False)


def make_case(out_dir, case, cfg, B, T, grad_clip, seed, steps=3, lr=1e-3, betas=(0.9, 0.95),
              eps=1e-8, weight_decay=0.1, freeze=()):
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
            elif ".lora_B." in name:
                # B starts at zero (peft), which would leave A's gradient zero: give it values.
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    freeze_parameters(model, cfg, freeze)
    gen = torch.Generator().manual_seed(seed + 2)
    tokens = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=gen)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    meta_cfg = {"n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd,
                "vocab_size": cfg.vocab_size, "max_seq_len": cfg.block_size}
    meta_lora = {}
    if cfg.lora_rank > 0:  # what microtrain reads to build the model with the same adapters
        meta_lora = {"lora_rank": cfg.lora_rank, "lora_alpha": repr(float(cfg.lora_alpha)),
                     "lora_targets": ",".join(t for t in LORA_TARGET_ORDER
                                              if t in cfg.lora_targets)}
    # The state_dict exactly as PyTorch has it: lm_head.weight (tied) and attn.bias buffers too.
    sd = model.state_dict()
    assert "lm_head.weight" in sd and "transformer.h.0.attn.bias" in sd
    write_safetensors(os.path.join(out_dir, f"{case}_weights.safetensors"), sd,
                      dict(meta_cfg, **meta_lora,
                           source="tools/make_reference.py (PyTorch nanoGPT)"))
    write_safetensors(os.path.join(out_dir, f"{case}_batch.safetensors"),
                      {"inputs": inputs.to(torch.int32), "targets": targets.to(torch.int32)})

    names = param_names(model)
    params = dict(model.named_parameters())
    trained = [n for n in names if params[n].requires_grad]  # AdamW's; the only gradients
    opt = model.configure_optimizer(lr, betas, eps, weight_decay)
    losses, norms, first_grads = [], [], None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(inputs, targets)
        loss.backward()
        losses.append(loss.item())
        if first_grads is None:
            first_grads = {n: params[n].grad.detach().clone() for n in trained}
            assert all(params[n].grad is None for n in names if n not in trained)
        total = torch.sqrt(sum((params[n].grad.double() ** 2).sum() for n in trained)).item()
        norms.append(total)
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_([params[n] for n in trained], grad_clip)
        opt.step()

    expected = {"loss": torch.tensor(losses, dtype=torch.float32)}
    for n in trained:
        expected["grad." + n] = first_grads[n]
    for n in names:
        expected[n] = params[n].detach()
    if freeze:
        meta_cfg = dict(meta_cfg, freeze=",".join(freeze))  # optim.freeze / step --freeze
    meta = dict(meta_cfg, **meta_lora, steps=steps, lr=repr(lr), beta1=repr(betas[0]), beta2=repr(betas[1]),
                eps=repr(eps), weight_decay=repr(weight_decay), grad_clip=repr(grad_clip),
                source="tools/make_reference.py (torch %s)" % torch.__version__)
    for i, nrm in enumerate(norms):
        meta[f"grad_norm.{i}"] = repr(nrm)
    write_safetensors(os.path.join(out_dir, f"{case}_expected.safetensors"), expected, meta)
    if grad_clip > 0:
        assert all(nrm > grad_clip for nrm in norms), "clipping must be active on every step"
    print(f"{case}: L{cfg.n_layer} C{cfg.n_embd} H{cfg.n_head} T{cfg.block_size} "
          f"V{cfg.vocab_size}, batch {B}x{T}, clip {grad_clip}, {len(trained)} of {len(names)} "
          f"tensors train: losses "
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
    # LoRA on three of a block's four Linears (attn.c_proj stays plain), the base frozen.
    make_case(args.out_dir, "tiny_lora",
              Config(2, 2, 32, 16, 200, lora_rank=4, lora_alpha=8.0,
                     lora_targets=("attn.c_attn", "mlp.c_fc", "mlp.c_proj")),
              B=3, T=16, grad_clip=0.0, seed=7)
    # optim.freeze: the embeddings (so the tied LM head too) and block 0; clipping on the rest.
    make_case(args.out_dir, "tiny_freeze", Config(2, 2, 32, 16, 200), B=3, T=16, grad_clip=0.05,
              seed=11, freeze=("wte", "wpe", "h.0"))


if __name__ == "__main__":
    sys.exit(main())
