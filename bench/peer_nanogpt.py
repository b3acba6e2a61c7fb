#!/usr/bin/python3
"""The peer for bench/train_throughput.py: a GPT of the nanoGPT architecture (pre-LayerNorm,
GELU MLP of 4 x d_model, learned positions, tied embeddings, causal attention through torch's
fused scaled-dot-product kernel), trained on the same byte-level corpus with AdamW and gradient
clipping, the way a researcher would write it. Written for this repository; it is what ablate's
trainer is compared against, so it uses the fastest native ops torch offers:
F.scaled_dot_product_attention(is_causal=True) on torch >= 2, its 1.13 precursor
F._scaled_dot_product_attention otherwise; foreach (CPU) or fused (CUDA) AdamW; torch.compile
with --compile (torch >= 2 only). Prints one JSON line (the last line of stdout).

    /usr/bin/python3 bench/peer_nanogpt.py --d-model 128 --seq-len 256 --batch 128 --steps 5
    python3 bench/peer_nanogpt.py --device cuda --compile --d-model 512 --seq-len 512 --batch 64
    /usr/bin/python3 bench/peer_nanogpt.py --nanogpt ~/src/nanoGPT --d-model 128 --seq-len 128 --batch 8

With --nanogpt DIR it trains karpathy/nanoGPT's own GPT instead: DIR/model.py, imported as it is
from a copy the user points to (never vendored here), its GPTConfig at these sizes (vocabulary
256, no dropout, --bias as given), its configure_optimizers (AdamW, fused on CUDA where torch has
it), the loss its forward returns; the rest of the loop is this file's. Its MLP is nanoGPT's
4 x d_model GELU; on torch 1.13 its attention is the explicit masked softmax nanoGPT falls back
to without F.scaled_dot_product_attention. impl is then "nanogpt".

The JSON line: impl "nanogpt_peer", tokens_per_s, step_ms and cpu_ms (process CPU time per
step) over the timed steps (after
--warmup untimed ones, the device synchronised at both ends), params, flops_per_token (training
FLOPs counted as ablate counts them, config/param_count.cc: 6 x matmul parameters + 12 x layers x
d_model x seq_len for attention), and the settings that produced it.
"""
import argparse
import inspect
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 256  # byte-level, as ablate's default corpus


def torch_major():
    return int(torch.__version__.split(".")[0])


def causal_attention(q, k, v):  # (B, H, T, dk) each -> (B, H, T, dk)
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2: flash / memory-efficient / math
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # torch 1.13: the native composite of the same op (returns output and optional weights).
    return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)[0]


def layer_norm(c):
    """LayerNorm without a bias unless --bias, where torch can (>= 2.1); torch 1.13's has one."""
    if not c.bias and "bias" in inspect.signature(nn.LayerNorm).parameters:
        return nn.LayerNorm(c.d_model, bias=False)
    return nn.LayerNorm(c.d_model)


class SelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c.heads
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model, bias=c.bias)
        self.proj = nn.Linear(c.d_model, c.d_model, bias=c.bias)

    def forward(self, x):  # (B, T, d)
        B, T, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q = q.view(B, T, self.heads, d // self.heads).transpose(1, 2)  # (B, H, T, dk)
        k = k.view(B, T, self.heads, d // self.heads).transpose(1, 2)  # (B, H, T, dk)
        v = v.view(B, T, self.heads, d // self.heads).transpose(1, 2)  # (B, H, T, dk)
        y = causal_attention(q, k, v)                                    # (B, H, T, dk)
        return self.proj(y.transpose(1, 2).reshape(B, T, d))            # (B, T, d)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.up = nn.Linear(c.d_model, c.mlp, bias=c.bias)
        self.down = nn.Linear(c.mlp, c.d_model, bias=c.bias)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_attn = layer_norm(c)
        self.attn = SelfAttention(c)
        self.ln_mlp = layer_norm(c)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, c.d_model)
        self.pos = nn.Embedding(c.seq_len, c.d_model)
        self.blocks = nn.ModuleList([Block(c) for _ in range(c.layers)])
        self.ln_f = layer_norm(c)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        for block in self.blocks:  # GPT-2's scaled init of the residual projections
            for proj in (block.attn.proj, block.mlp.down):
                nn.init.normal_(proj.weight, 0.0, 0.02 / math.sqrt(2 * c.layers))

    def forward(self, tokens, targets):  # (B, T) each
        T = tokens.size(1)
        x = self.tok(tokens) + self.pos(torch.arange(T, device=tokens.device))  # (B, T, d)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.tok.weight)  # (B, T, V), tied
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def flops_per_token(c):
    """ablate's count (config/param_count.cc ForwardFlopsPerToken, x 3): matmul parameters (the
    output projection counted once, lookups and norms not) and attention over seq_len keys."""
    per_layer = 3 * c.d_model * c.d_model + c.d_model * c.d_model + 2 * c.d_model * c.mlp
    matmul = c.layers * per_layer + VOCAB * c.d_model
    attention = 4.0 * c.layers * c.d_model * c.seq_len
    return 3.0 * (2.0 * matmul + attention)


def load_nanogpt(directory):
    """karpathy/nanoGPT's model.py from `directory`, imported under its own name."""
    path = os.path.join(os.path.expanduser(directory), "model.py")
    if not os.path.isfile(path):
        sys.exit(f"peer_nanogpt: --nanogpt {directory}: no model.py there (a checkout of "
                 "karpathy/nanoGPT)")
    import importlib.util
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=32, help="heads = d_model / head_dim")
    p.add_argument("--mlp", type=int, default=0, help="MLP width, default 4 x d_model")
    p.add_argument("--bias", action="store_true", help="biases in Linear and LayerNorm (nanoGPT's "
                   "GPTConfig default; its train.py trains without)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="autocast dtype of the forward pass; auto: bfloat16 on CUDA when "
                   "supported, float32 (no autocast) on the CPU")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (torch >= 2)")
    p.add_argument("--data", default=os.path.join(HERE, "..", "data", "kjv.txt"),
                   help="byte-level corpus (ablate's default, `make data`)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nanogpt", default="",
                   help="a directory holding karpathy/nanoGPT's model.py: train its GPT instead")
    c = p.parse_args()
    c.heads = c.d_model // c.head_dim
    c.mlp = c.mlp or 4 * c.d_model
    if c.compile and torch_major() < 2:
        sys.exit(f"peer_nanogpt: --compile needs torch >= 2 (torch.compile); this is torch "
                 f"{torch.__version__}")
    device = torch.device(c.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"peer_nanogpt: --device {c.device} but torch {torch.__version__} sees no CUDA device")
    dtype = c.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if device.type == "cpu" and dtype == "bfloat16":
        sys.exit("peer_nanogpt: bfloat16 autocast is for CUDA here (ablate trains fp32 on the CPU)")
    torch.set_num_threads(c.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    with open(c.data, "rb") as f:
        corpus = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    torch.manual_seed(c.seed)
    if c.nanogpt:
        real = load_nanogpt(c.nanogpt)
        config = real.GPTConfig(block_size=c.seq_len, vocab_size=VOCAB, n_layer=c.layers,
                                n_head=c.heads, n_embd=c.d_model, dropout=0.0, bias=c.bias)
        model = real.GPT(config).to(device)
        c.mlp = 4 * c.d_model  # nanoGPT's MLP
        opt = model.configure_optimizers(0.1, 3e-3, (0.9, 0.95), device.type)
        compiled = torch.compile(model) if c.compile else model
        step_fn = lambda x, y: compiled(x, y)[1]  # (logits, loss)
    else:
        model = GPT(c).to(device)
        decay = [q for q in model.parameters() if q.dim() >= 2]
        no_decay = [q for q in model.parameters() if q.dim() < 2]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
        adamw = inspect.signature(torch.optim.AdamW).parameters
        extra = {}
        if device.type == "cuda" and "fused" in adamw:
            extra["fused"] = True
        elif "foreach" in adamw:
            extra["foreach"] = True
        opt = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, **extra)
        step_fn = torch.compile(model) if c.compile else model
    autocast = (torch.autocast(device_type="cuda", dtype=torch.bfloat16)
                if dtype == "bfloat16" else None)

    gen = torch.Generator().manual_seed(c.seed + 1)
    offsets = torch.arange(c.seq_len + 1)

    def get_batch():  # random windows of the corpus, as nanoGPT's get_batch
        starts = torch.randint(0, corpus.numel() - c.seq_len - 1, (c.batch, 1), generator=gen)
        window = corpus[starts + offsets].long()  # (B, T + 1)
        x, y = window[:, :-1], window[:, 1:]
        if device.type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.contiguous(), y.contiguous()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    start = None
    for step in range(c.warmup + c.steps):
        if step == c.warmup:
            sync()
            start = time.perf_counter()
            cpu_start = time.process_time()
        x, y = get_batch()
        opt.zero_grad(set_to_none=True)
        if autocast is not None:
            with autocast:
                loss = step_fn(x, y)
        else:
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()  # a host sync per step, as a training loop that logs its loss has
    sync()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    print(json.dumps({
        "impl": "nanogpt" if c.nanogpt else "nanogpt_peer", "d_model": c.d_model, "layers": c.layers, "heads": c.heads,
        "mlp": c.mlp, "batch": c.batch, "seq_len": c.seq_len,
        "params": sum(q.numel() for q in model.parameters()),
        "tokens_per_s": c.steps * c.batch * c.seq_len / elapsed,
        "step_ms": 1e3 * elapsed / c.steps, "cpu_ms": 1e3 * cpu / c.steps,
        "flops_per_token": flops_per_token(c),
        "threads": c.threads, "device": str(device), "dtype": dtype, "compile": c.compile,
        "torch": torch.__version__, "loss": loss.item()}))


if __name__ == "__main__":
    main()
