#!/usr/bin/python3
"""The reference for bench/train_throughput: ablate's baseline model and training loop written
plainly in PyTorch, the way a researcher would (nanoGPT style). Run by Debian's /usr/bin/python3
(torch 1.13, the same kernels as our LibTorch). Prints one JSON line: tokens/s over the timed
steps.

    /usr/bin/python3 bench/reference_train.py --d-model 128 --layers 4 --steps 20

Its defaults are bench_train's (heads = d_model / head_dim, ffn = 4 x d_model), and it prints its
parameter count, so bench/train_throughput.py can check that both sides train the same model.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq_len, head_dim, base):
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat([angles, angles], -1)
    return angles.cos().float(), angles.sin().float()


def rope(x, cos, sin):  # x: (B, T, H, dk)
    T, half = x.size(1), x.size(3) // 2
    cos = cos[:T].view(1, T, 1, -1)
    sin = sin[:T].view(1, T, 1, -1)
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, self.h, self.kv, self.dk = c.d_model, c.heads, c.kv_heads, c.head_dim
        self.q_proj = nn.Linear(d, self.h * self.dk, bias=False)
        self.k_proj = nn.Linear(d, self.kv * self.dk, bias=False)
        self.v_proj = nn.Linear(d, self.kv * self.dk, bias=False)
        self.o_proj = nn.Linear(self.h * self.dk, d, bias=False)
        self.q_norm = RMSNorm(self.dk, 1e-6)
        self.k_norm = RMSNorm(self.dk, 1e-6)
        cos, sin = rope_tables(c.seq_len, self.dk, 10000.0)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        mask = torch.full((c.seq_len, c.seq_len), float("-inf")).triu(1)
        self.register_buffer("mask", mask)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.h, self.dk))
        k = self.k_norm(self.k_proj(x).view(B, T, self.kv, self.dk))
        v = self.v_proj(x).view(B, T, self.kv, self.dk)
        q = rope(q, self.cos, self.sin).transpose(1, 2)
        k = rope(k, self.cos, self.sin).transpose(1, 2)
        v = v.transpose(1, 2)
        if self.kv != self.h:
            k = k.repeat_interleave(self.h // self.kv, 1)
            v = v.repeat_interleave(self.h // self.kv, 1)
        att = (q * (1.0 / math.sqrt(self.dk))) @ k.transpose(-2, -1) + self.mask[:T, :T]
        y = torch.softmax(att, -1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.h * self.dk))


class SwiGLU(nn.Module):
    def __init__(self, d, width):
        super().__init__()
        self.gate = nn.Linear(d, width, bias=False)
        self.up = nn.Linear(d, width, bias=False)
        self.down = nn.Linear(width, d, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attn_norm = RMSNorm(c.d_model, 1e-6)
        self.attn = Attention(c)
        self.ffn_norm = RMSNorm(c.d_model, 1e-6)
        self.ffn = SwiGLU(c.d_model, c.ffn)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.ffn(self.ffn_norm(x))


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed = nn.Embedding(256, c.d_model)
        self.blocks = nn.ModuleList([Block(c) for _ in range(c.layers)])
        self.final_norm = RMSNorm(c.d_model, 1e-6)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.final_norm(x), self.embed.weight)  # tied


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=0, help="default d_model / head_dim")
    p.add_argument("--kv-heads", type=int, default=0)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--ffn", type=int, default=0, help="default 4 x d_model")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    c = p.parse_args()
    c.heads = c.heads or c.d_model // c.head_dim
    c.kv_heads = c.kv_heads or c.heads
    c.ffn = c.ffn or 4 * c.d_model
    torch.set_num_threads(c.threads)
    torch.manual_seed(0)
    model = Model(c)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(1)
    tokens_per_step = c.batch * c.seq_len
    start = None
    for step in range(c.warmup + c.steps):
        if step == c.warmup:
            start = time.perf_counter()
            cpu_start = time.process_time()
        x = torch.randint(0, 256, (c.batch, c.seq_len), generator=gen)
        y = torch.randint(0, 256, (c.batch, c.seq_len), generator=gen)
        for g in opt.param_groups:
            g["lr"] = 3e-3
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, 256), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    print(json.dumps({"impl": "pytorch", "d_model": c.d_model, "params": sum(p.numel() for p in model.parameters()),
                      "tokens_per_s": c.steps * tokens_per_step / elapsed,
                      "step_ms": 1e3 * elapsed / c.steps, "cpu_ms": 1e3 * cpu / c.steps,
                      "threads": c.threads}))


if __name__ == "__main__":
    main()
