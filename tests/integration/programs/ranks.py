"""A data-parallel program's ranks for tests/integration/program_test.cc (standard library only):
every rank writes the environment ablate gave it (torchrun's variables), its pid and its process
group to env-attempt-A-rank-R.txt in the checkpoint dir (NAME=value lines), then "trains" `steps`
steps beside the others (no real collective: each sleeps a step's time). Rank 0 reports through
python/ablate_report.py and checkpoints; the others only print. The `mode` param makes one rank
misbehave: `rank1_fails` has rank 1 start a child (which must go with the group) and exit 1 at
step 15 of the first attempt, while rank 0 waits after step 15 as in a collective that never
completes, until it is stopped; `spike` has rank 0 report a loss spike at step 25, after which
ablate relaunches every rank with ABLATE_ROLLBACK (their files then end in "-rollback").
"""
import json
import os
import subprocess
import sys
import time

import ablate_report

report = ablate_report.report()
params = report.config()
mode = params.get("mode", "good")
steps = int(params.get("steps", 30))
rank = report.rank()

names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "CUDA_VISIBLE_DEVICES", "ABLATE_RUN_ID", "ABLATE_ATTEMPT", "ABLATE_ROLLBACK")
rollback = report.rollback()  # (A, B): resumed from step A, the batches of A+1..B skipped
seen = ["%s=%s" % (name, os.environ[name]) for name in names if name in os.environ]
seen += ["pid=%d" % os.getpid(), "pgid=%d" % os.getpgrp()]
path = report.checkpoint_dir() / ("env-attempt-%s-rank-%d%s.txt"
                                  % (report.attempt(), rank, "-rollback" if rollback else ""))
report.checkpoint_dir().mkdir(parents=True, exist_ok=True)
with open(str(path), "w") as f:
    f.write("".join(line + "\n" for line in seen))
print("rank %d of %s says hello" % (rank, os.environ.get("WORLD_SIZE")), flush=True)

start = 0
latest = report.latest_checkpoint()
if latest is not None:
    start = latest[0]
if rollback is not None:
    start = max(start, rollback[1])
report.params(total=2)
for step in range(start + 1, steps + 1):
    if report.should_stop(step):
        sys.exit(ablate_report.EXIT_TERMINATED)
    time.sleep(0.05)
    while rank == 0 and mode == "rank1_fails" and report.attempt() == 1 and step > 15:
        if report.should_stop():
            sys.exit(ablate_report.EXIT_TERMINATED)
        time.sleep(0.05)  # waiting for rank 1, which is gone
    if rank == 1 and mode == "rank1_fails" and report.attempt() == 1 and step == 15:
        # A child that would outlive the rank: it goes with the attempt's process group.
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # ranks.py child"])
        print("rank 1: simulated failure at step 15", flush=True)
        sys.exit(1)
    if rank != 0:
        print("rank %d step %d" % (rank, step), flush=True)
        continue
    loss = 1000.0 if mode == "spike" and step == 25 and rollback is None else 1.0 / step
    report.step(step, loss, grad_norm=1.0, tokens=8)
    if step % 10 == 0 or step == steps:
        report.eval(step, 1.0 / step)
        with report.checkpoint(step) as d:
            with open(os.path.join(str(d), "state.json"), "w") as f:
                json.dump({"step": step}, f)
report.end()
