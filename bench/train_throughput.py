#!/usr/bin/python3
"""Training throughput of ablate against the PyTorch reference, gate overhead and MFU, measured
side by side: every round runs each measurement once, in turn, so machine noise hits all alike;
medians over rounds are compared.

    /usr/bin/python3 bench/train_throughput.py [--build build] [--rounds 5] [--steps 15]

Targets (issue 3): ablate >= 1.2x the reference at d_model 128 and not slower at 256; G1
elementwise (FFN narrowed to match) <= 1.05x the baseline's step time; MFU >= 50% at 256.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--rounds", type=int, default=5,
                   help="the VM drifts by +-10%% between runs: fewer rounds, noisier medians")
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    a = p.parse_args()
    ours = os.path.join(a.build, "bench_train")
    common = ["--steps", str(a.steps), "--threads", str(a.threads)]
    sizes = {128: [], 256: []}
    jobs = {}
    for d in sizes:
        jobs[(d, "ablate")] = [ours, "--d-model", str(d)] + common
        jobs[(d, "pytorch")] = ["/usr/bin/python3", os.path.join(HERE, "reference_train.py"),
                                "--d-model", str(d)] + common
        jobs[(d, "g1")] = [ours, "--d-model", str(d), "--variant", "g1_elementwise", "--match-ffn"] + common
    jobs[("matmul",)] = [ours, "--matmul", "--threads", str(a.threads)]
    results = {k: [] for k in jobs}
    last = {}
    for r in range(a.rounds):
        for k, cmd in jobs.items():
            out = run(cmd)
            last[k] = out
            results[k].append(out["flops"] if k == ("matmul",) else out["tokens_per_s"])
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    # A ratio means something only between equal models: the reference must mirror bench_train.
    for d in sizes:
        ours_params, ref_params = last[(d, "ablate")]["params"], last[(d, "pytorch")]["params"]
        if ours_params != ref_params:
            sys.exit(f"train_throughput: at d_model {d} ablate trains {ours_params} parameters and "
                     f"the reference {ref_params}: the two models differ")
    med = {k: statistics.median(v) for k, v in results.items()}
    peak = med[("matmul",)]
    print(f"train_throughput: batch 16 x 256 tokens, 4 layers, {a.threads} threads, "
          f"{a.rounds} rounds x {a.steps} steps, medians")
    print(f"fp32 matmul (1024^3): {peak / 1e9:.1f} GFLOP/s")
    print(f"{'d_model':>8} {'params':>9} {'ablate tok/s':>13} {'pytorch tok/s':>14} {'ratio':>6} "
          f"{'g1 tok/s':>9} {'g1 step/base':>13} {'ablate MFU':>11}")
    for d in sizes:
        ours_tps, ref_tps, g1_tps = med[(d, "ablate")], med[(d, "pytorch")], med[(d, "g1")]
        mfu = ours_tps * last[(d, "ablate")]["flops_per_token"] / peak
        print(f"{d:>8} {last[(d, 'ablate')]['params']:>9} {ours_tps:>13.0f} {ref_tps:>14.0f} {ours_tps / ref_tps:>6.2f} "
              f"{g1_tps:>9.0f} {ours_tps / g1_tps:>13.3f} {100 * mfu:>10.1f}%")


if __name__ == "__main__":
    main()
