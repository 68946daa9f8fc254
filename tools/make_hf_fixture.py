#!/usr/bin/env python3
"""A tiny Hugging Face GPT-2 fixture: microtrain's `model.init_from`, `sample` and `export --hf`
are tested against it (tests/test_pretrained.cpp) without transformers in CI.

Regenerate with ONE command (from the repository root), in a venv holding torch, transformers
4.46 and safetensors (e.g. `python3 -m venv /work/pyenv && /work/pyenv/bin/pip install torch
transformers==4.46.0 safetensors`):

    /work/pyenv/bin/python tools/make_hf_fixture.py

It writes
  tests/data/hf_gpt2_tiny/config.json          GPT2Config as save_pretrained writes it
  tests/data/hf_gpt2_tiny/model.safetensors    its weights as save_pretrained writes them: names
                                               transformer.wte.weight, transformer.h.N.attn.
                                               c_attn.weight ... (GPT2LMHeadModel's state_dict),
                                               Conv1D weights stored (in, out), the tied lm_head
                                               left out (save_pretrained drops tied weights)
  tests/data/hf_gpt2_tiny_logits.safetensors   I32 `tokens` (1, 16) and F32 `logits` (1, 16, 300):
                                               the model's own forward on those tokens

The model: 2 layers, n_embd 64, 4 heads, n_positions 64, vocab 300 (microtrain pads it to 384
rows, so the padding path is exercised; the tokens include ids above 255), gelu_new (tanh GELU),
LayerNorm eps 1e-5: exactly microtrain's GPT-2. Its random init is Hugging Face's (N(0, 0.02),
zero biases, unit LayerNorm); every tensor is then perturbed (biases and LayerNorm parameters
N(0, 0.1), weights scaled up) so that a transposed weight, a dropped bias or a swapped q/k/v gives
a visible difference in the logits. float32, one thread, fixed seed: deterministic for a given
PyTorch build.

Also: `/work/pyenv/bin/python tools/make_hf_fixture.py --check-export DIR` loads DIR (what
`microtrain export CKPT --hf DIR` wrote) with GPT2LMHeadModel.from_pretrained and prints the max
difference of its logits on the fixture's tokens against the fixture's reference logits: the
"our export loads in transformers" half of the contract.
"""

import argparse
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
MODEL_DIR = os.path.join(DATA, "hf_gpt2_tiny")
LOGITS = os.path.join(DATA, "hf_gpt2_tiny_logits.safetensors")
# Includes ids >= 256 (past a byte vocabulary) and the last id, 299.
TOKENS = [0, 17, 255, 256, 299, 42, 42, 7, 128, 280, 3, 99, 1, 200, 298, 64]


def make_model():
    torch.manual_seed(28)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=300,
                        activation_function="gelu_new", layer_norm_epsilon=1e-5,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                        eos_token_id=0)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
            else:
                p.mul_(4.0)
    return model


def forward_logits(model):
    with torch.no_grad():
        return model(torch.tensor([TOKENS])).logits.float().contiguous()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check-export", metavar="DIR",
                    help="load DIR with from_pretrained and compare its logits")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.check_export:
        model = GPT2LMHeadModel.from_pretrained(args.check_export, attn_implementation="eager")
        ref = load_file(LOGITS)["logits"]
        diff = (forward_logits(model.eval()) - ref).abs().max().item()
        print(f"{args.check_export}: loaded by GPT2LMHeadModel.from_pretrained; max |logit diff| "
              f"vs {os.path.relpath(LOGITS, ROOT)} = {diff:.3g}")
        sys.exit(0 if diff <= 1e-4 else 1)
    model = make_model()
    os.makedirs(MODEL_DIR, exist_ok=True)
    model.save_pretrained(MODEL_DIR, safe_serialization=True)
    # generation_config.json is not part of the contract (microtrain neither reads nor writes it).
    gen = os.path.join(MODEL_DIR, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    os.chmod(os.path.join(MODEL_DIR, "model.safetensors"), 0o644)  # safetensors writes 0600
    save_file({"tokens": torch.tensor([TOKENS], dtype=torch.int32),
               "logits": forward_logits(model)}, LOGITS)
    print(f"wrote {MODEL_DIR} and {LOGITS}")


if __name__ == "__main__":
    main()
