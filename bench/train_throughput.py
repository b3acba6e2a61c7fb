#!/usr/bin/python3
"""Training throughput of ablate over a grid of shapes, against two PyTorch programs, measured
side by side: every round runs each measurement once, in turn, so machine noise hits all alike;
medians over rounds are compared.

    /usr/bin/python3 bench/train_throughput.py [--build build] [--rounds 3] [--steps 2]
    /usr/bin/python3 bench/train_throughput.py --quick            # 1 round, 2 timed steps
    /usr/bin/python3 bench/train_throughput.py --d-model 128 --seq 256 --rounds 5
    /usr/bin/python3 bench/train_throughput.py --only-g1          # only G1 against the baseline
    /usr/bin/python3 bench/train_throughput.py --only-g1 --g1-unit block --pair-steps 20

At every grid point (d_model x seq_len, 4 layers, batch = tokens_per_step / seq_len):
- ablate: `bench_train`, the baseline with SwiGLU width round(8 d / 3), whose three matrices
  hold the FLOPs of a 4 x d GELU MLP;
- the peer: bench/peer_nanogpt.py, the nanoGPT architecture (LayerNorm, GELU, learned positions,
  fused attention) in Debian's torch 1.13, on the same corpus and threads;
- the same-architecture reference: bench/reference_train.py, ablate's own model and loop in
  eager PyTorch (refused unless its parameter count equals ablate's);
- G1: `bench_train --pair g1_elementwise --match-ffn`, the gate with the FFN narrowed until the
  parameters match, trained step for step beside the baseline in one process (each step timed
  against its neighbour of the other model, so the VM's drift cancels); the median of the
  per-step time ratios of every round pooled, with its 95% confidence interval (distribution-
  free, from the binomial order statistics; it takes 6 pairs or more, and it treats the pairs as
  independent) (the pair's tokens/s, kept in --json, are not a run alone's);
- G1 by blocks (--g1-unit block): one transformer block of each, forward and backward on the
  same input, in turn (`bench_train --pair-blocks`); everything else in a step is the same for
  two FFN-matched models, so the step's ratio lies between 1 and the blocks', and a block pair
  takes a quarter of a step pair: more pairs in the same minutes for a tighter interval;
- MFU of ablate and of the peer: training FLOPs per token (config/param_count.cc) x tokens/s over
  the fp32 1024^3 matmul FLOP/s measured in every round of the same point.

The last two columns compare process CPU time per step instead of wall time (bench_train and
both Python programs report it; for G1, pair by pair): with --omp-wait-policy PASSIVE, a thread
waiting for a descheduled peer sleeps instead of spinning, so CPU time is close to the work done
whatever else runs on the machine; it says nothing about how well the work spreads over the
threads.

Points are measured one after the other, each in its own alternating rounds, and each row is
printed as soon as its point is done.

Targets (issue 22): ablate >= 1.2x the peer at every point; MFU >= 60% at d_model >= 256; G1
step <= 1.03x the baseline's at every point.

--small-steps measures the second grid, the step sizes CPU studies run (issue 43): 1,024 tokens a
step (8 x 128, experiments/small's), 4,096 (32 x 128) and 8,192 (32 x 256), at d_model 64, 128
and 256, 4 layers, on 1 and 2 threads (--threads, default both), against the repo's peer and
against karpathy/nanoGPT's own model.py read from --nanogpt DIR (a checkout the user points to,
never vendored: peer_nanogpt.py --nanogpt). Its columns: ablate, the peer and nanoGPT tokens/s,
ablate over each, and the peer over nanoGPT (the two peers should agree within 10%). Target:
ablate >= 1.2x nanoGPT at every point.

    /usr/bin/python3 bench/train_throughput.py --small-steps --nanogpt ~/src/nanoGPT
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, env):
    """The measurement's JSON line, or None (and its error on stderr) when it failed, so that one
    shape that does not fit in memory leaves the rest of the grid measured."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        print(f"train_throughput: exit {p.returncode}: {' '.join(cmd)}\n{p.stderr[-2000:]}",
              file=sys.stderr)
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])


def median_ci(xs, level=0.95):
    """A distribution-free confidence interval for the median of xs: the order statistics
    x_(k), x_(n-k+1) with k the largest count where P(Binomial(n, 1/2) <= k - 1) <= (1 - level) / 2.
    (nan, nan) with fewer than 6 values, where no such k exists at 95%."""
    xs, n, alpha = sorted(xs), len(xs), (1 - level) / 2
    k, cdf = 0, 0.0
    while k <= n:
        p = math.comb(n, k) / 2 ** n
        if cdf + p > alpha:
            break
        cdf, k = cdf + p, k + 1
    if k == 0:
        return float("nan"), float("nan")
    return xs[k - 1], xs[n - k]


def swiglu_width(d):
    """Width of a SwiGLU whose 3 d x w matrices hold the 8 d^2 parameters of a 4 x d GELU MLP."""
    return round(8 * d / 3)


SMALL_STEPS = [(1024, 128), (4096, 128), (8192, 256)]  # (tokens per step, seq)


def small_steps(a, env):
    """The second grid (issue 43): small steps against the repo's peer and nanoGPT itself."""
    if not a.nanogpt or not os.path.isfile(os.path.join(os.path.expanduser(a.nanogpt), "model.py")):
        sys.exit("train_throughput: --small-steps needs --nanogpt DIR, a checkout of "
                 "karpathy/nanoGPT (its model.py is read at run time, never vendored)")
    ours = os.path.join(a.build, "bench_train")
    py = "/usr/bin/python3"
    peer = os.path.join(HERE, "peer_nanogpt.py")
    threads = a.small_threads
    print(f"train_throughput --small-steps: {a.layers} layers, {a.rounds} rounds x ({a.warmup} + "
          f"{a.steps}) steps per point, medians; OMP_WAIT_POLICY {env.get('OMP_WAIT_POLICY', 'unset')}",
          flush=True)
    header = ("| threads | d_model | tokens/step | batch x seq | ablate tok/s | peer tok/s | "
              "nanoGPT tok/s | ablate/nanoGPT | ablate/peer | peer/nanoGPT |")
    print(header)
    print("|" + "---:|" * (header.count("|") - 1), flush=True)
    began, summary = time.time(), []
    for th in threads:
        for d in a.d_model:
            for tokens, seq in SMALL_STEPS:
                if tokens not in a.small_tokens:
                    continue
                batch = tokens // seq
                common = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--threads", str(th),
                          "--batch", str(batch), "--layers", str(a.layers)]
                head_dim = min(32, d // 2)
                jobs = {
                    "ablate": [ours, "--d-model", str(d), "--seq", str(seq), "--head-dim",
                               str(head_dim), "--ffn", str(swiglu_width(d))] + common,
                    "peer": [py, peer, "--d-model", str(d), "--seq-len", str(seq), "--head-dim",
                             str(head_dim)] + common,
                    "nanogpt": [py, peer, "--nanogpt", a.nanogpt, "--d-model", str(d),
                                "--seq-len", str(seq), "--head-dim", str(head_dim)] + common,
                }
                results = {k: [] for k in jobs}
                for _ in range(a.rounds):
                    for k, cmd in jobs.items():
                        out = run(cmd, env)
                        if out is not None:
                            results[k].append(out["tokens_per_s"])
                med = {k: statistics.median(v) if v else float("nan") for k, v in results.items()}
                row = {"threads": th, "d_model": d, "tokens": tokens, "batch": batch, "seq": seq,
                       **med, "raw": results}
                print(f"| {th} | {d} | {tokens} | {batch} x {seq} | {med['ablate']:.0f} | "
                      f"{med['peer']:.0f} | {med['nanogpt']:.0f} | "
                      f"{med['ablate'] / med['nanogpt']:.2f} | {med['ablate'] / med['peer']:.2f} | "
                      f"{med['peer'] / med['nanogpt']:.2f} |", flush=True)
                summary.append(row)
                if a.json:
                    with open(a.json, "w") as f:
                        json.dump({"args": vars(a), "points": summary}, f, indent=1)
    print(f"{time.time() - began:.0f} s")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--d-model", type=int, nargs="+", default=[128, 256, 512])
    p.add_argument("--seq", type=int, nargs="+", default=[128, 256, 512])
    p.add_argument("--tokens-per-step", type=int, default=32768,
                   help="batch = this / seq (the issue asks for 32-64k)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3,
                   help="the VM drifts by +-10%% between runs: fewer rounds, noisier medians")
    p.add_argument("--steps", type=int, default=2, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--quick", action="store_true", help="1 round of 2 timed steps")
    p.add_argument("--no-reference", action="store_true", help="skip the same-architecture column")
    p.add_argument("--pair-steps", type=int, default=6,
                   help="G1: timed steps of each model per round, paired step by step (6 or "
                   "more give a 95%% interval from one round)")
    p.add_argument("--g1-unit", default="step", choices=["step", "block"],
                   help="G1: pair whole training steps, or one block's forward and backward "
                   "(bench_train --pair-blocks; give it more --pair-steps)")
    p.add_argument("--only-g1", action="store_true",
                   help="measure only G1 against the baseline (the G1 target); the other columns "
                   "print nan")
    p.add_argument("--omp-wait-policy", default="inherit", choices=["inherit", "PASSIVE", "ACTIVE"],
                   help="OMP_WAIT_POLICY of every measured process (both sides share libgomp). "
                   "With other processes busy on the cores, the default spin-waiting lets one "
                   "descheduled thread stall every parallel region: PASSIVE keeps a shared "
                   "machine's numbers from collapsing (docs/benchmarks.md)")
    p.add_argument("--json", help="also write every measurement and the medians to this file")
    p.add_argument("--small-steps", action="store_true",
                   help="the second grid: 1k-8k tokens a step against the peer and nanoGPT itself")
    p.add_argument("--nanogpt", default="", help="--small-steps: a checkout of karpathy/nanoGPT")
    p.add_argument("--small-threads", type=int, nargs="+", default=[1, 2],
                   help="--small-steps: the thread counts measured")
    p.add_argument("--small-tokens", type=int, nargs="+", choices=[t for t, _ in SMALL_STEPS],
                   default=[t for t, _ in SMALL_STEPS],
                   help="--small-steps: the tokens-per-step points measured")
    a = p.parse_args()
    if a.small_steps:
        if a.d_model == [128, 256, 512]:
            a.d_model = [64, 128, 256]
        if a.steps == 2:
            a.steps = 20
        if a.warmup == 1:
            a.warmup = 3
        env = dict(os.environ)
        if a.omp_wait_policy != "inherit":
            env["OMP_WAIT_POLICY"] = a.omp_wait_policy
        return small_steps(a, env)
    if a.quick:
        a.rounds, a.steps = 1, 2
    if a.only_g1:
        a.no_reference = True
    env = dict(os.environ)
    if a.omp_wait_policy != "inherit":
        env["OMP_WAIT_POLICY"] = a.omp_wait_policy
    ours = os.path.join(a.build, "bench_train")
    py = "/usr/bin/python3"
    points = [(d, t) for d in a.d_model for t in a.seq]
    header = (f"| d_model | seq | batch | ablate tok/s | peer tok/s | ablate/peer | "
              f"{'' if a.no_reference else 'same-arch tok/s | ablate/same-arch | '}"
              f"ablate MFU | peer MFU | matmul GFLOP/s | G1 {a.g1_unit}/base | G1 95% CI | "
              f"ablate/peer by CPU time | G1/base by CPU time |")
    print(f"train_throughput: {a.layers} layers, {a.tokens_per_step} tokens per step, "
          f"{a.threads} threads, {a.rounds} rounds x ({a.warmup} + {a.steps}) steps per point "
          f"(G1: {a.warmup} + {a.pair_steps} pairs of {a.g1_unit}s), medians; OMP_WAIT_POLICY {env.get('OMP_WAIT_POLICY', 'unset')}", flush=True)
    print(header)
    print("|" + "---:|" * (header.count("|") - 1), flush=True)
    began = time.time()
    load = [os.getloadavg()[0]]
    summary, raw = [], {}
    # Point by point, each point's measurements in alternating rounds (the fp32 matmul among
    # them, for its MFU): a ratio compares measurements minutes apart, never hours, and each
    # row is printed as soon as it is measured.
    for d, t in points:
        batch = a.tokens_per_step // t
        w = swiglu_width(d)
        common = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--threads", str(a.threads),
                  "--batch", str(batch), "--layers", str(a.layers)]
        ablate = [ours, "--d-model", str(d), "--seq", str(t), "--ffn", str(w)] + common
        jobs = {"matmul": [ours, "--matmul", "--threads", str(a.threads)], "ablate": ablate,
                "peer": [py, os.path.join(HERE, "peer_nanogpt.py"), "--d-model", str(d),
                         "--seq-len", str(t)] + common}
        if not a.no_reference:
            jobs["reference"] = [py, os.path.join(HERE, "reference_train.py"), "--d-model", str(d),
                                 "--seq-len", str(t), "--ffn", str(w)] + common
        jobs["g1"] = [ours, "--d-model", str(d), "--seq", str(t), "--ffn", str(w), "--pair",
                      "g1_elementwise", "--match-ffn", "--steps", str(a.pair_steps), "--warmup",
                      str(a.warmup), "--threads", str(a.threads), "--batch", str(batch),
                      "--layers", str(a.layers)] + (["--pair-blocks"] if a.g1_unit == "block" else [])
        if a.only_g1:
            jobs = {"g1": jobs["g1"]}
        results = {k: [] for k in jobs}
        pair_ratios, pair_cpu_ratios = [], []  # G1 over the baseline, step by step
        cpu_ms = {}  # CPU time per step, where the program reports it
        last = {}
        for r in range(a.rounds):
            for k, cmd in jobs.items():
                out = run(cmd, env)
                if out is None:
                    continue
                last[k] = out
                if k == "g1":
                    pair_ratios += out["ratios"]
                    pair_cpu_ratios += out["cpu_ratios"]
                    if "pair_tokens_per_s" in out:  # not for blocks
                        results[k].append(out["pair_tokens_per_s"])
                    continue
                if out.get("kernel_threads", a.threads) < a.threads:
                    print(f"train_throughput: ablate's fused kernels ran on "
                          f"{out['kernel_threads']} of {a.threads} threads: built without "
                          f"OpenMP? (worker/model/CMakeLists.txt)", file=sys.stderr, flush=True)
                results[k].append(out["flops"] if k == "matmul" else out["tokens_per_s"])
                if "cpu_ms" in out:
                    cpu_ms.setdefault(k, []).append(out["cpu_ms"])
            load.append(os.getloadavg()[0])
            print(f"d_model {d} seq {t}: round {r + 1}/{a.rounds} done after "
                  f"{time.time() - began:.0f} s", file=sys.stderr, flush=True)
        # A same-architecture ratio means something only between equal models.
        if "ablate" in last and "reference" in last and last["ablate"]["params"] != last["reference"]["params"]:
            sys.exit(f"train_throughput: at d_model {d} ablate trains {last['ablate']['params']} "
                     f"parameters and the reference {last['reference']['params']}: the two models differ")
        med = {k: float("nan") for k in ("matmul", "ablate", "peer", "reference", "g1")}
        med.update({k: statistics.median(v) for k, v in results.items() if v})
        peak = med["matmul"]
        fpt = lambda impl: last[impl]["flops_per_token"] if impl in last else float("nan")
        row = {"d_model": d, "seq": t, "batch": batch, "ablate": med["ablate"], "peer": med["peer"],
               "g1": med["g1"], "matmul_flops": peak, "mfu": med["ablate"] * fpt("ablate") / peak,
               "peer_mfu": med["peer"] * fpt("peer") / peak,
               "g1_step_ratio": statistics.median(pair_ratios) if pair_ratios else float("nan"),
               "g1_ci": median_ci(pair_ratios), "g1_pairs": len(pair_ratios),
               "g1_unit": a.g1_unit}
        cpu = {k: statistics.median(v) for k, v in cpu_ms.items()}
        row["cpu_ratio"] = cpu["peer"] / cpu["ablate"] if "peer" in cpu and "ablate" in cpu else float("nan")
        row["g1_cpu_ratio"] = (statistics.median(pair_cpu_ratios) if pair_cpu_ratios
                               else float("nan"))
        ref = ""
        if not a.no_reference:
            row["reference"] = med["reference"]
            ref = f"{row['reference']:.0f} | {row['ablate'] / row['reference']:.2f} | "
        print(f"| {d} | {t} | {batch} | {row['ablate']:.0f} | {row['peer']:.0f} | "
              f"{row['ablate'] / row['peer']:.2f} | {ref}{100 * row['mfu']:.1f}% | "
              f"{100 * row['peer_mfu']:.1f}% | {peak / 1e9:.1f} | {row['g1_step_ratio']:.3f} | "
              f"{row['g1_ci'][0]:.3f}-{row['g1_ci'][1]:.3f} ({row['g1_pairs']} pairs) | "
              f"{row['cpu_ratio']:.2f} | {row['g1_cpu_ratio']:.3f} |",
              flush=True)
        summary.append(row)
        raw[f"{d}x{t}"] = dict(results, g1_ratios=pair_ratios, g1_cpu_ratios=pair_cpu_ratios)
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"args": vars(a), "load": load, "points": summary, "raw": raw}, f, indent=1)
    print(f"{time.time() - began:.0f} s; 1-min load average {min(load):.1f}-{max(load):.1f}")

if __name__ == "__main__":
    main()
