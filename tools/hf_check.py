#!/usr/bin/env python3
"""hf_check.py ASYNCPP WORKDIR - asyncpp's Hugging Face import and export
against transformers itself (needs torch, transformers, tokenizers).

For a tiny random GPT2LMHeadModel and a tiny random LlamaForCausalLM (GQA,
untied head), each with a byte-level BPE tokenizer trained here:
  1. save_pretrained, `asyncpp import-hf`, and compare the loss `asyncpp
     eval` computes on fixed tokens with transformers' (float64);
  2. `asyncpp export --format hf`, load it with
     AutoModelForCausalLM.from_pretrained: every parameter equals the
     original bit for bit and the logits on the fixed tokens agree;
  3. the exported tokenizer.json, loaded by transformers, encodes a text to
     the ids `asyncpp tokenize encode --ids` gives, and to the original
     tokenizer's ids;
  4. `--dtype bf16`: every parameter equals the original rounded to bf16.
Prints one line per check and exits 1 when any fails. tools/gpu-check runs
it when python3 has transformers.
"""
import os
import struct
import subprocess
import sys

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, PreTrainedTokenizerFast)

TEXT = ("The tide came in over the flat sand, and the gulls rose and settled again. "
        "It's the 3rd time they've done it; we'll watch 12 more.\n\n  Indented, tabs\tand "
        "caf\u00e9s; na\u00efve \u4f60\u597d!!\n") * 4
B, T = 2, 32
failed = 0


def check(name, ok, detail=""):
    global failed
    print("%s %s%s" % ("PASS" if ok else "FAIL", name, ": " + detail if detail and not ok else ""))
    failed += not ok


def run(*args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError("%s: %s" % (" ".join(args), r.stderr.strip()))
    return r.stdout


def train_tokenizer(path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT], trainer)
    tok.save(path)
    return tok


def randomize(model):
    """weights large enough that a mistake shows in the loss"""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 1 and ("ln" in n or "norm" in n) and n.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def one(asyncpp, work, arch):
    d = os.path.join(work, arch)
    os.makedirs(d, exist_ok=True)
    tok = train_tokenizer(os.path.join(d, "tokenizer.json"))
    V = tok.get_vocab_size()
    if arch == "gpt2":
        cfg = GPT2Config(vocab_size=V, n_positions=T, n_embd=64, n_layer=2, n_head=4)
        model = GPT2LMHeadModel(cfg)
    else:
        cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                          rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
    randomize(model)
    model.eval()
    model.save_pretrained(d, safe_serialization=True)

    # fixed tokens: a stream of B*T+1 as an llm.c token shard (what eval reads)
    g = torch.Generator().manual_seed(2)
    stream = torch.randint(0, V, (B * T + 1,), generator=g).tolist()
    with open(os.path.join(work, arch + "-tokens.bin"), "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, len(stream)] + [0] * 253)))
        f.write(struct.pack("<%dH" % len(stream), *stream))
    x = torch.tensor(stream[:-1]).view(B, T)
    y = torch.tensor(stream[1:]).view(B, T)
    with torch.no_grad():
        ref = model.double()(x).logits
        want = F.cross_entropy(ref.reshape(-1, V), y.reshape(-1)).item()
        model.float()
        logits32 = model(x).logits

    ckpt = os.path.join(work, arch + ".ckpt")
    run(asyncpp, "import-hf", "-o", ckpt, d)
    out = run(asyncpp, "eval", ckpt, "--data", os.path.join(work, arch + "-tokens.bin"),
              "--batches", "1", "--batch-size", str(B))
    got = float([l.split()[1] for l in out.splitlines() if l.startswith("loss")][0])
    check("%s import: asyncpp loss %.6f = transformers %.6f" % (arch, got, want),
          abs(got - want) < 1e-4 * max(1.0, abs(want)))

    exp = os.path.join(work, arch + "-export")
    run(asyncpp, "export", "--format", "hf", "--force", "-o", exp, ckpt)
    back = AutoModelForCausalLM.from_pretrained(exp, torch_dtype=torch.float32).eval()
    sd, sd2 = model.state_dict(), back.state_dict()
    bad = [k for k, v in sd.items() if k in sd2 and not torch.equal(v, sd2[k])]
    missing = [k for k in sd if k not in sd2]
    check("%s export: from_pretrained gives every parameter bit for bit" % arch,
          not bad and not missing, "differ %s, missing %s" % (bad[:3], missing[:3]))
    with torch.no_grad():
        d_logits = (back(x).logits - logits32).abs().max().item()
    check("%s export: logits agree (max |diff| %.2e)" % (arch, d_logits), d_logits < 1e-5)

    ht = PreTrainedTokenizerFast(tokenizer_file=os.path.join(exp, "tokenizer.json"))
    with open(os.path.join(work, "text.txt"), "w", encoding="utf-8") as f:
        f.write(TEXT)
    ours = [int(v) for v in run(asyncpp, "tokenize", "encode", "-t", ckpt[:-5] + ".tok", "--ids",
                                os.path.join(work, "text.txt")).split()]
    theirs = ht.encode(TEXT)
    orig = tok.encode(TEXT).ids
    check("%s tokenizer: exported tokenizer.json encodes as asyncpp and the original" % arch,
          theirs == ours == orig, "%d/%d/%d ids" % (len(theirs), len(ours), len(orig)))

    exp16 = os.path.join(work, arch + "-bf16")
    run(asyncpp, "export", "--format", "hf", "--force", "--dtype", "bf16", "-o", exp16, ckpt)
    b16 = AutoModelForCausalLM.from_pretrained(exp16, torch_dtype=torch.bfloat16).state_dict()
    bad = [k for k, v in sd.items() if k in b16 and not torch.equal(v.to(torch.bfloat16), b16[k])]
    check("%s export bf16: parameters are the originals rounded to bf16" % arch, not bad,
          "differ %s" % bad[:3])


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: hf_check.py ASYNCPP WORKDIR")
    asyncpp, work = os.path.abspath(sys.argv[1]), sys.argv[2]
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(0)
    for arch in ("gpt2", "llama"):
        try:
            one(asyncpp, work, arch)
        except Exception as e:  # one architecture's failure does not hide the other's
            check("%s" % arch, False, str(e))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
