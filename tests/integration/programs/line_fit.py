"""A small real trainer for tests/integration/program_test.cc (standard library only): fits
y = 3x + 1 by SGD on a fixed synthetic set, through python/ablate_report.py, checkpointing its
weights and resuming from them. The `mode` param makes it misbehave the ways a user's program
can, one at a time, so that the worker's handling of each is tested end to end.
"""
import json
import math
import os
import random
import subprocess
import sys
import time

import ablate_report

params = ablate_report.report().config()
mode = params.get("mode", "good")
steps = int(params.get("steps", 40))
lr = float(params.get("lr", 0.05))
delay = float(params.get("delay", 0))  # seconds per step: slow enough to be stopped mid-run
report = ablate_report.report()
seed = report.seed() or 0

rng = random.Random(seed)
data = [(x / 10.0, 3 * x / 10.0 + 1 + rng.gauss(0, 0.05)) for x in range(-10, 11)]

if mode == "never_reports":
    print("training... (this program reports nothing ablate can read)")
    sys.exit(0)
if mode == "permanent":
    report.error("dataset missing: /nonexistent", permanent=True)
    sys.exit(2)
if mode == "stubborn":
    # Ignores SIGTERM and never ends: the worker kills its group after grace_s.
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    step = 0
    while True:
        step = min(step + 1, steps)
        report.step(step, 1.0)
        time.sleep(0.1)
if mode == "flood":
    # 32 MB of output against max_log_bytes 1 MiB: the oldest is dropped, the run unharmed.
    line = "x" * 1023
    for _ in range(32 * 1024):
        print(line)
if mode == "fork":
    # A child that would outlive its parent: the worker kills the process group.
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print("started a child; exiting 1")
    sys.exit(1)

w, b, start = 0.0, 0.0, 0
latest = report.latest_checkpoint()
if latest is not None:
    start, path = latest
    with open(os.path.join(path, "weights.json")) as f:
        w, b = json.load(f)
report.params(total=2)
rollback = report.rollback()  # (A, B): resumed from step A, the batches of A+1..B skipped
if rollback is not None:
    start = max(start, rollback[1])


def loss_and_grads(w, b):
    loss = gw = gb = 0.0
    for x, y in data:
        e = w * x + b - y
        loss += e * e
        gw += 2 * e * x
        gb += 2 * e
    n = len(data)
    return loss / n, gw / n, gb / n


for step in range(start + 1, steps + 1):
    if report.should_stop():
        sys.exit(ablate_report.EXIT_TERMINATED)
    time.sleep(delay)
    loss, gw, gb = loss_and_grads(w, b)
    w -= lr * gw
    b -= lr * gb
    if mode == "misreports" and step == 5:
        print("@ablate " + json.dumps({"t": "step", "step": 2, "loss": 1.0}))   # backwards
        print("@ablate {not json")
        print("@ablate " + json.dumps({"t": "eval", "step": 5, "val_loss": 1.0,
                                       "metrics": {"m" * 10000: 1.0}}))
        print("x" * (10 << 20))                                                  # a 10 MB line
        sys.stdout.buffer.write(bytes(range(256)) * 64 + b"\n")                  # binary output
        sys.stdout.flush()
        print("@ablate " + json.dumps({"t": "step", "step": 10 ** 9, "loss": 1.0}))  # past the end
    if mode == "spike" and step == 25 and rollback is None:
        loss = 1000.0  # a bad batch: ablate rolls back past it
    report.step(step, loss, grad_norm=math.hypot(gw, gb), lr=lr, tokens=len(data))
    if step % 10 == 0 or step == steps:
        report.eval(step, loss_and_grads(w, b)[0],
                    metrics={"gate_score": 0.5, "slope_error": abs(w - 3),
                             # an evaluation task's name: the same columns (docs/evals.md)
                             "passkey@64": 1.0 / (1.0 + abs(w - 3))})
        with report.checkpoint(step) as d:
            with open(os.path.join(d, "weights.json"), "w") as f:
                json.dump([w, b], f)
        if mode == "crash_once" and report.attempt() == 1 and step == 20:
            print("simulated crash after the checkpoint of step 20", flush=True)
            os._exit(1)
    if mode == "nan" and step >= 5:
        report.step(step + 1, float("nan"))
        sys.exit(3)
report.end()
