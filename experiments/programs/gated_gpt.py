#!/usr/bin/env python3
"""A small byte-level GPT with an optional G1 attention gate, run as an ablate program.

The model is a pre-norm decoder-only transformer over bytes (vocabulary 256, learned positions,
output head tied to the token embedding). With ``gate="g1"`` each attention layer multiplies
every head's attention output elementwise by ``sigmoid(x W_g)`` before the output projection,
where ``x`` is the layer's normed input and ``W_g`` maps ``n_embd`` to ``n_head * head_dim``
without bias: the G1 position of "Gated Attention for Large Language Models" (Qiu et al., 2025).

Params: the defaults in DEFAULTS, overridden by the JSON object in ABLATE_CONFIG, then by
``--key=value`` arguments (the value parsed as a Python literal, else taken as a string; it must
have the default's type, an int standing for a float). ABLATE_SEED, when set, overrides ``seed``.
Unknown keys and ill-typed values are permanent failures (exit 2).

  gated_gpt.py [--key=value ...]   train, reporting through ablate_report's protocol
  gated_gpt.py --count             for each JSON params object on a line of stdin, print
                                   {"total": N, "activated": N} (exit 2 on a bad line)

Steps are numbered from 1; the checkpoint at step k holds the state after k steps. Step s
trains on a batch drawn from a generator seeded by (seed, s) alone, so a run resumed from a
checkpoint continues exactly as if it had not stopped, and ABLATE_ROLLBACK="A-B" is honoured by
continuing at step B+1: the batches of steps A+1..B are never trained on, and the learning-rate
schedule continues at B+1. A step whose loss or gradient norm is not finite is reported but
leaves the weights unchanged; three in a row end the run as diverged (exit 3).

Data parallel: with WORLD_SIZE > 1 (the torchrun variables ablate sets for `resources: {devices:
N}`, or torchrun's own) every rank joins a process group (init_method env://; gloo on the CPU,
nccl on CUDA) and trains a DistributedDataParallel copy on its own rows of each step's batch:
rank r takes rows r*B/N..(r+1)*B/N-1 of the batch_size B rows a one-process run draws, so the
global batch, the averaged gradient and the reported loss (averaged over the ranks) are a
one-process run's, up to float summation order. batch_size must be a multiple of WORLD_SIZE.
Rank 0 alone reports, evaluates and writes checkpoints (the same state.pt as one process: a run
may resume on another number of ranks); every rank resumes from the checkpoint, and the ranks
agree before each step whether to stop (SIGTERM on any rank, the rung), so they stop together.
On CUDA a rank trains on its visible device (ablate gives each rank one: device "cuda").
"""
import ast
import contextlib
import hashlib
import json
import math
import os
import sys
from pathlib import Path

try:
    import ablate_report
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
    import ablate_report

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ConfigError = ablate_report.ConfigError

DEFAULTS = {
    "n_layer": 2, "n_head": 4, "n_embd": 64, "ffn_hidden": 0, "gate": "none", "block_size": 64,
    "batch_size": 8, "lr": 3e-3, "min_lr": 3e-4, "warmup": 10, "max_iters": 200,
    "weight_decay": 0.1, "grad_clip": 1.0, "eval_every": 50, "eval_iters": 10,
    "ckpt_every": 50, "seed": 0, "dataset": "", "device": "cpu", "dtype": "float32",
    "threads": 0,
}
ARCH_KEYS = ("n_layer", "n_head", "n_embd", "ffn_hidden", "gate", "block_size")
GATES = ("none", "g1")
DTYPES = ("float32", "bfloat16")
VOCAB = 256
MAX_NONFINITE = 3
DEFAULT_DATASET = Path(__file__).resolve().parents[2] / "data" / "kjv.txt"
_SDPA = getattr(F, "scaled_dot_product_attention", None)  # PyTorch >= 2.0


# ---- params -------------------------------------------------------------------------------------

def parse_argv(items):
    """--key=value items as a dict; a str param keeps the text unless it is a quoted literal."""
    overrides = {}
    for item in items:
        if not item.startswith("--") or "=" not in item:
            raise ConfigError("expected --key=value, got %r" % item)
        key, text = item[2:].split("=", 1)
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        if isinstance(DEFAULTS.get(key), str) and not isinstance(value, str):
            value = text
        overrides[key] = value
    return overrides


def resolve(*layers):
    """DEFAULTS overridden by each layer in turn, type-checked and validated."""
    params = dict(DEFAULTS)
    for layer in layers:
        for key, value in layer.items():
            if key not in DEFAULTS:
                raise ConfigError("unknown param %r" % key)
            default = DEFAULTS[key]
            if isinstance(default, float) and type(value) is int:
                value = float(value)
            if type(value) is not type(default):
                raise ConfigError("param %r must be %s, got %r"
                                  % (key, type(default).__name__, value))
            params[key] = value
    validate(params)
    return params


def validate(p):
    for key in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "max_iters",
                "eval_iters"):
        if p[key] < 1:
            raise ConfigError("param %r must be >= 1, got %r" % (key, p[key]))
    for key in ("ffn_hidden", "warmup", "eval_every", "ckpt_every", "threads", "lr", "min_lr",
                "weight_decay", "grad_clip"):
        if not p[key] >= 0:
            raise ConfigError("param %r must be >= 0, got %r" % (key, p[key]))
    if p["n_embd"] % p["n_head"]:
        raise ConfigError("n_embd (%d) must be a multiple of n_head (%d)"
                          % (p["n_embd"], p["n_head"]))
    if p["gate"] not in GATES:
        raise ConfigError("gate must be one of %s, got %r" % (", ".join(GATES), p["gate"]))
    if p["dtype"] not in DTYPES:
        raise ConfigError("dtype must be one of %s, got %r" % (", ".join(DTYPES), p["dtype"]))


def ffn_width(p):
    return p["ffn_hidden"] or 4 * p["n_embd"]


def count_params(p):
    """The model's parameter count, by formula; equal to GPT(p)'s (tests check it)."""
    d, f = p["n_embd"], ffn_width(p)
    per_layer = (2 * d                                   # ln1
                 + 3 * d * d + d * d                     # qkv, output projection
                 + (d * d if p["gate"] == "g1" else 0)   # G1 gate W_g
                 + 2 * d                                 # ln2
                 + 2 * d * f)                            # MLP
    total = VOCAB * d + p["block_size"] * d + p["n_layer"] * per_layer + 2 * d  # + ln_f
    return {"total": total, "activated": total}


# ---- model --------------------------------------------------------------------------------------

def causal_attention(q, k, v):
    """Causal scaled dot-product attention over (batch, head, time, head_dim) tensors."""
    if _SDPA is not None:
        return _SDPA(q, k, v, is_causal=True)
    t = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return F.softmax(scores.float(), dim=-1).to(v.dtype) @ v


class Attention(nn.Module):
    def __init__(self, p):
        super().__init__()
        d, self.n_head = p["n_embd"], p["n_head"]
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.gate = nn.Linear(d, d, bias=False) if p["gate"] == "g1" else None
        self.proj = nn.Linear(d, d, bias=False)
        self.gate_score = None  # the mean gate value of the last forward pass (g1 only)

    def forward(self, x):
        b, t, c = x.shape
        h = self.n_head
        q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = causal_attention(q, k, v).transpose(1, 2)  # (b, t, h, head_dim)
        if self.gate is not None:
            g = torch.sigmoid(self.gate(x)).view(b, t, h, c // h)
            self.gate_score = g.detach().float().mean()
            y = y * g
        return self.proj(y.reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, p):
        super().__init__()
        d = p["n_embd"]
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(p)
        self.mlp = nn.Sequential(nn.Linear(d, ffn_width(p), bias=False), nn.GELU(),
                                 nn.Linear(ffn_width(p), d, bias=False))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, p):
        super().__init__()
        d = p["n_embd"]
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(p["block_size"], d)
        self.blocks = nn.ModuleList(Block(p) for _ in range(p["n_layer"]))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.head.weight = self.tok.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        """The mean cross-entropy of predicting targets from idx, both (batch, time) bytes."""
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, VOCAB), targets.reshape(-1))

    def gate_score(self):
        """The mean sigmoid gate value over layers in the last forward pass; None without gate."""
        scores = [b.attn.gate_score for b in self.blocks if b.attn.gate_score is not None]
        return torch.stack(scores).mean().item() if scores else None


# ---- data ---------------------------------------------------------------------------------------

def stream_seed(seed, stream, index):
    """A 63-bit generator seed from (seed, stream, index), the same in every process."""
    digest = hashlib.sha256(("%d/%s/%d" % (seed, stream, index)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


class Batches:
    """Batch `index` of a stream is a pure function of (seed, stream, index)."""

    def __init__(self, data, p, stream):
        self.data, self.stream = data, stream
        self.block, self.batch, self.seed = p["block_size"], p["batch_size"], p["seed"]
        self.offsets = torch.arange(self.block + 1)

    def get(self, index, device, shard=None):
        """Batch `index` as (inputs, targets); `shard` (rank, world): that rank's rows only."""
        g = torch.Generator().manual_seed(stream_seed(self.seed, self.stream, index))
        starts = torch.randint(len(self.data) - self.block, (self.batch,), generator=g)
        if shard is not None:
            rank, world = shard
            rows_per_rank = self.batch // world
            starts = starts[rank * rows_per_rank:(rank + 1) * rows_per_rank]
        rows = self.data[starts[:, None] + self.offsets].long()
        return rows[:, :-1].to(device), rows[:, 1:].to(device)


def load_dataset(p):
    """(train, val) uint8 tensors: the first 90% of the dataset's bytes and the rest."""
    # Empty: the corpus ablate's own model trains on by default (the worker says where it is),
    # else the repository's data/kjv.txt (`make data`).
    default = os.environ.get("ABLATE_DEFAULT_CORPUS") or DEFAULT_DATASET
    path = Path(p["dataset"]) if p["dataset"] else Path(default)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError("cannot read dataset %s: %s" % (path, e.strerror or e)) from None
    split = int(len(raw) * 0.9)
    if min(split, len(raw) - split) < p["block_size"] + 1:
        raise ConfigError("dataset %s (%d bytes) is too small for block_size %d"
                          % (path, len(raw), p["block_size"]))
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return data[:split], data[split:]


# ---- training -----------------------------------------------------------------------------------

def lr_at(step, p):
    """Linear warmup over the first `warmup` steps, then cosine decay to min_lr at max_iters."""
    if step <= p["warmup"]:
        return p["lr"] * step / p["warmup"]
    progress = min(1.0, (step - p["warmup"]) / max(1, p["max_iters"] - p["warmup"]))
    return p["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * progress)) * (p["lr"] - p["min_lr"])


class Trainer:
    def __init__(self, p, rep, device, rank=0, world=1):
        self.p, self.rep, self.device = p, rep, device
        self.rank, self.world = rank, world
        train, val = load_dataset(p)
        self.train_batches, self.val_batches = Batches(train, p, "train"), Batches(val, p, "val")
        torch.manual_seed(p["seed"])
        self.model = GPT(p).to(device)
        counts = count_params(p)
        if sum(t.numel() for t in self.model.parameters()) != counts["total"]:
            raise RuntimeError("count_params disagrees with the model")
        rep.params(**counts)
        matrices = [t for t in self.model.parameters() if t.dim() >= 2]
        vectors = [t for t in self.model.parameters() if t.dim() < 2]
        self.opt = torch.optim.AdamW([{"params": matrices, "weight_decay": p["weight_decay"]},
                                      {"params": vectors, "weight_decay": 0.0}],
                                     lr=p["lr"], betas=(0.9, 0.95))
        self.step = 0
        self.resumed_step = None  # the checkpoint's step when this attempt resumed
        self.last_ckpt = self.last_eval = None
        self.trained = self.model  # what a step runs: the model, or its DDP wrapper (run)
        self.terminated = False    # SIGTERM reached some rank (several ranks: agreed on)

    def autocast(self):
        if self.p["dtype"] == "float32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def resume(self):
        found = self.rep.latest_checkpoint()
        if found is not None:
            # This program's own checkpoint. weights_only is explicit because its default
            # changed in PyTorch 2.6, and 1.13's weights-only unpickler cannot read floats.
            state = torch.load(str(found[1] / "state.pt"), map_location=self.device,
                               weights_only=False)
            arch = {k: self.p[k] for k in ARCH_KEYS}
            if state["arch"] != arch:
                raise ConfigError("checkpoint %s was made for %r, not %r"
                                  % (found[1], state["arch"], arch))
            self.model.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
            self.step = self.resumed_step = self.last_ckpt = int(state["step"])
        rollback = self.rep.rollback()
        if rollback is not None:
            first, last = rollback
            if self.step != first:
                print("gated_gpt: ABLATE_ROLLBACK=%d-%d but resuming at step %d; continuing at "
                      "step %d" % (first, last, self.step, max(self.step, last) + 1),
                      file=sys.stderr)
            self.step = max(self.step, last)  # steps first+1..last are skipped, never trained

    def train_step(self):
        """Train step self.step on its batch: (loss, pre-clip grad norm, lr, finite)."""
        lr = lr_at(self.step, self.p)
        for group in self.opt.param_groups:
            group["lr"] = lr
        shard = (self.rank, self.world) if self.world > 1 else None
        x, y = self.train_batches.get(self.step, self.device, shard)
        with self.autocast():
            loss = self.trained(x, y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # with several ranks DDP averages the gradients: the global batch's
        clip = self.p["grad_clip"] if self.p["grad_clip"] > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
        if self.world > 1:
            # The global batch's loss: the mean of the ranks' (equal shards). Every rank gets the
            # same value and the same norm, so all of them step, or skip, alike.
            loss = loss.detach().float().clone()
            dist.all_reduce(loss)
            loss /= self.world
        loss = loss.item()
        finite = math.isfinite(loss) and math.isfinite(norm)
        if finite:
            self.opt.step()
        return loss, norm, lr, finite

    @torch.no_grad()
    def evaluate(self):
        self.last_eval = self.step
        if self.rank != 0:
            return  # rank 0 evaluates and reports: the other ranks' weights are the same
        self.model.eval()
        losses, gates = [], []
        for i in range(self.p["eval_iters"]):
            x, y = self.val_batches.get(i, self.device)
            with self.autocast():
                losses.append(self.model(x, y).item())
            score = self.model.gate_score()
            if score is not None:
                gates.append(score)
        self.model.train()
        metrics = {"gate_score": sum(gates) / len(gates)} if gates else None
        self.rep.eval(self.step, sum(losses) / len(losses), metrics)

    def checkpoint(self):
        if self.rank != 0:
            self.last_ckpt = self.step
            return  # rank 0 writes the checkpoint every rank resumes from
        state = {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                 "step": self.step, "arch": {k: self.p[k] for k in ARCH_KEYS}}
        with self.rep.checkpoint(self.step) as directory:
            torch.save(state, str(directory / "state.pt"))
        self.last_ckpt = self.step

    def should_stop(self):
        """Whether to stop before the next step: SIGTERM, or the rung. With several ranks they
        agree (a SIGTERM on any rank stops all), so that every rank stops at the same step."""
        if self.world == 1:
            self.terminated = self.rep.sigterm_received()
            return self.rep.should_stop(self.step)
        flag = torch.tensor([1.0 if self.rep.sigterm_received() else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.terminated = flag.item() > 0
        return self.terminated or self.rep.at_rung(self.step)

    def run(self):
        p, rep = self.p, self.rep
        self.resume()
        if self.world > 1:
            # After resuming: every rank starts from the same weights (the checkpoint, or the
            # same seed's initialisation), which DDP checks by broadcasting rank 0's.
            self.trained = torch.nn.parallel.DistributedDataParallel(self.model)
        nonfinite = 0
        while self.step < p["max_iters"] and not self.should_stop():
            self.step += 1
            loss, norm, lr, finite = self.train_step()
            rep.step(self.step, loss, grad_norm=norm, lr=lr,
                     tokens=p["batch_size"] * p["block_size"])
            nonfinite = 0 if finite else nonfinite + 1
            if nonfinite >= MAX_NONFINITE:
                rep.error("diverged: %d non-finite steps in a row, the last at step %d"
                          % (nonfinite, self.step))
                return ablate_report.EXIT_DIVERGED
            if p["eval_every"] and self.step % p["eval_every"] == 0:
                self.evaluate()
            if p["ckpt_every"] and self.step % p["ckpt_every"] == 0:
                self.checkpoint()

        finished = self.step >= p["max_iters"]
        if (self.terminated or rep.sigterm_received()) and not finished:
            if self.last_ckpt != self.step:
                self.checkpoint()
            return ablate_report.EXIT_TERMINATED
        if self.last_eval != self.step:
            self.evaluate()
        if self.last_ckpt != self.step:
            self.checkpoint()
        elif self.step == self.resumed_step:
            rep.ckpt(self.step)  # durable already; this attempt has not said so yet
        if finished:
            rep.end()
        return ablate_report.EXIT_OK  # finished, or paused at the ABLATE_STOP_AT_STEP rung


# ---- entry points -------------------------------------------------------------------------------

def count_main(stdin, stdout, stderr):
    for lineno, line in enumerate(stdin, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ConfigError("expected a JSON object, got %s" % type(obj).__name__)
            counts = count_params(resolve(obj))
        except ValueError as e:  # ConfigError and json.JSONDecodeError
            print("gated_gpt --count: line %d: %s" % (lineno, e), file=stderr)
            return ablate_report.EXIT_PERMANENT
        stdout.write(json.dumps(counts) + "\n")
        stdout.flush()
    return ablate_report.EXIT_OK


def ranks(p, rep):
    """(rank, world size) from torchrun's RANK and WORLD_SIZE; (0, 1) when WORLD_SIZE is unset."""
    text = os.environ.get("WORLD_SIZE", "").strip() or "1"
    try:
        world = int(text)
    except ValueError:
        raise ConfigError("WORLD_SIZE must be an integer, got %r" % text) from None
    rank = rep.rank()
    if world < 1 or not 0 <= rank < world:
        raise ConfigError("RANK %d and WORLD_SIZE %d: need 0 <= RANK < WORLD_SIZE" % (rank, world))
    if p["batch_size"] % world:
        raise ConfigError("batch_size %d must be a multiple of WORLD_SIZE %d (each rank trains "
                          "batch_size / WORLD_SIZE rows of each batch)" % (p["batch_size"], world))
    return rank, world


def main(argv):
    if "--count" in argv:
        if len(argv) != 1:
            print("gated_gpt: --count takes no other arguments", file=sys.stderr)
            return ablate_report.EXIT_PERMANENT
        return count_main(sys.stdin, sys.stdout, sys.stderr)
    rep = ablate_report.report()
    try:
        p = resolve(rep.config(), parse_argv(argv))
        if rep.seed() is not None:
            p["seed"] = rep.seed()
        rep.stop_at_step()  # malformed values fail here, before any work
        rep.rollback()
        try:
            device = torch.device(p["device"])
        except RuntimeError as e:
            raise ConfigError("bad device %r: %s" % (p["device"], e)) from None
        if p["threads"] > 0:
            torch.set_num_threads(p["threads"])
        if device.type == "cuda" and not torch.cuda.is_available():
            rep.error("device %r requested but CUDA is not available" % p["device"])
            return 1
        rank, world = ranks(p, rep)
        if world == 1:
            return Trainer(p, rep, device).run()
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://")
        try:
            return Trainer(p, rep, device, rank, world).run()
        finally:
            dist.destroy_process_group()
    except ConfigError as e:
        rep.error(str(e), permanent=True)
        print("gated_gpt: %s" % e, file=sys.stderr)
        return ablate_report.EXIT_PERMANENT


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
