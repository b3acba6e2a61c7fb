#!/usr/bin/python3
"""`ablate data prepare` against SentencePiece's own `spm_encode`, on the same text and the same
8k BPE model, side by side; then the memory `ablate data prepare` holds at two corpus sizes.

    /usr/bin/python3 bench/data_prepare_bench.py [--build build] [--corpus data/kjv.txt]
    /usr/bin/python3 bench/data_prepare_bench.py --mb 50 --memory-mb 50 200 --rounds 3

1. The text: --corpus (the KJV Bible, 4.4 MB) repeated with variation to --mb MB: each copy's
   verses in a different seeded order, and one verse in ten with its words reversed, so no copy
   repeats the last (SentencePiece caches nothing across lines, but the page cache and the
   branch predictors would flatter an exact repeat). Written once into --work.
2. One 8k BPE model, trained once on --corpus by `ablate-data prepare --tokenizer bpe` (its
   tokenizer.model), used by both sides.
3. Speed: `ablate-data prepare TEXT --tokenizer M --docs line` (every verse a document, the unit
   spm_encode encodes; default threads: every core) and `spm_encode --model M
   --output_format=id < TEXT > /dev/null` (one thread: it has no other mode), alternating, each
   --rounds times; the best wall time of each gives MB/s, and their ratio. CPU seconds (user +
   system, of the child) are printed beside: on a busy machine they say what each costs.
   ablate-data writes train.bin/val.bin and hashes every byte twice (inputs and splits);
   spm_encode's ids go to /dev/null.
4. Memory: the peak RSS of `ablate-data prepare` on --memory-mb corpora (the same text, longer),
   from getrusage of the child (wait4). Streaming keeps it flat: it should not grow with the
   corpus.

Targets (issue 56): ablate data prepare >= 0.9x spm_encode, and >= 5 MB/s of text on 2 cores for
an 8k BPE; memory bounded (the same peak RSS at both sizes, within noise).
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import time


def write_corpus(source, path, megabytes, seed=1):
    """`source`'s lines repeated with variation until `megabytes` MB; returns the bytes written."""
    if os.path.exists(path) and os.path.getsize(path) >= megabytes * 1e6:
        return os.path.getsize(path)
    with open(source, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    rng = random.Random(seed)
    target = int(megabytes * 1e6)
    written = 0
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        while written < target:
            order = lines[:]
            rng.shuffle(order)
            chunk = []
            for line in order:
                if rng.random() < 0.1:
                    line = " ".join(reversed(line.split(" ")))
                chunk.append(line)
            text = "\n".join(chunk) + "\n"
            out.write(text)
            written += len(text.encode("utf-8"))
    os.replace(path + ".tmp", path)
    return os.path.getsize(path)


def run(cmd, stdin=None, stdout=None):
    """Runs `cmd`; returns (wall seconds, CPU seconds, peak RSS in MB). Exits on failure."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=stdin, stdout=stdout or subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    stderr = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{stderr}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="build", help="where ablate-data is")
    parser.add_argument("--corpus", default="data/kjv.txt")
    parser.add_argument("--work", default=None, help="scratch directory (default BUILD/bench_data)")
    parser.add_argument("--mb", type=float, default=50, help="text for the speed comparison")
    parser.add_argument("--memory-mb", type=float, nargs="+", default=[50, 200])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=0, help="ablate-data --threads (0: cores)")
    args = parser.parse_args()

    ablate_data = os.path.join(args.build, "ablate-data")
    spm_encode = shutil.which("spm_encode")
    if not os.path.exists(ablate_data):
        sys.exit(f"no {ablate_data}: build it first (cmake --build {args.build} --target ablate-data)")
    if spm_encode is None:
        sys.exit("no spm_encode: install Debian's sentencepiece package (make deps-bench)")
    work = args.work or os.path.join(args.build, "bench_data")
    os.makedirs(work, exist_ok=True)
    threads = ["--threads", str(args.threads)] if args.threads else []

    print(f"data_prepare_bench: {os.cpu_count()} cores; text from {args.corpus}", flush=True)
    sizes = sorted(set([args.mb] + args.memory_mb))
    texts = {}
    for mb in sizes:
        path = os.path.join(work, f"text_{mb:g}mb.txt")
        texts[mb] = (path, write_corpus(args.corpus, path, mb))

    model_dir = os.path.join(work, f"bpe{args.vocab_size}")
    shutil.rmtree(model_dir, ignore_errors=True)
    wall, cpu, _ = run([ablate_data, "prepare", args.corpus, "--docs", "line", "--tokenizer", "bpe",
                        "--vocab-size", str(args.vocab_size), "--out", model_dir, "--quiet"]
                       + threads)
    model = os.path.join(model_dir, "tokenizer.model")
    print(f"model: {args.vocab_size}-piece BPE trained on {args.corpus} in {wall:.1f} s", flush=True)

    text, nbytes = texts[args.mb]
    out = os.path.join(work, "prepared")
    best = {"ablate": None, "spm": None}
    print(f"\nspeed on {nbytes / 1e6:.1f} MB, {args.rounds} rounds, alternating:")
    print(f"| round | ablate data prepare | spm_encode |\n|---:|---:|---:|")
    for r in range(args.rounds):
        shutil.rmtree(out, ignore_errors=True)
        ours = run([ablate_data, "prepare", text, "--tokenizer", model, "--docs", "line",
                    "--out", out, "--quiet"] + threads)
        with open(text, "rb") as stdin:
            theirs = run([spm_encode, "--model", model, "--output_format=id"], stdin=stdin)
        for key, m in (("ablate", ours), ("spm", theirs)):
            if best[key] is None or m[0] < best[key][0]:
                best[key] = m
        print(f"| {r + 1} | {nbytes / 1e6 / ours[0]:.2f} MB/s ({ours[1]:.1f} CPU s) | "
              f"{nbytes / 1e6 / theirs[0]:.2f} MB/s ({theirs[1]:.1f} CPU s) |", flush=True)
    ours_mbs = nbytes / 1e6 / best["ablate"][0]
    spm_mbs = nbytes / 1e6 / best["spm"][0]
    ratio = ours_mbs / spm_mbs
    print(f"\nbest: ablate data prepare {ours_mbs:.2f} MB/s, spm_encode {spm_mbs:.2f} MB/s: "
          f"{ratio:.2f}x (target >= 0.9x: {'met' if ratio >= 0.9 else 'NOT met'}; "
          f">= 5 MB/s: {'met' if ours_mbs >= 5 else 'NOT met'})")
    print(f"CPU: ablate data prepare {nbytes / 1e6 / best['ablate'][1]:.2f} MB per CPU second, "
          f"spm_encode {nbytes / 1e6 / best['spm'][1]:.2f}")

    print("\nmemory (peak RSS of ablate-data prepare):")
    print("| text | peak RSS | wall | MB/s |\n|---:|---:|---:|---:|")
    for mb in args.memory_mb:
        path, size = texts[mb]
        shutil.rmtree(out, ignore_errors=True)
        wall, cpu, rss = run([ablate_data, "prepare", path, "--tokenizer", model, "--docs", "line",
                              "--out", out, "--quiet"] + threads)
        print(f"| {size / 1e6:.0f} MB | {rss:.1f} MB | {wall:.1f} s | {size / 1e6 / wall:.2f} |",
              flush=True)
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
