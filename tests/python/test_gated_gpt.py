"""Tests of experiments/programs/gated_gpt.py, run as ablate would run it (skipped without torch).

Run from the repository root: /usr/bin/python3 -m unittest discover -s tests/python -v
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "experiments" / "programs" / "gated_gpt.py"
PREFIX = "@ablate "

try:
    import torch  # noqa: F401
except ImportError:
    torch = None
    gated_gpt = None
else:
    sys.path.insert(0, str(PROGRAM.parent))
    import gated_gpt

TINY = {"n_layer": 1, "n_embd": 32, "n_head": 4, "block_size": 32, "batch_size": 4,
        "threads": 1, "warmup": 5, "eval_iters": 2}


def argv(params):
    return ["--%s=%s" % (k, v) for k, v in params.items()]


def records(text):
    """The report records in a program's output, in order."""
    out = []
    for line in text.splitlines():
        at = line.find(PREFIX)
        if at >= 0:
            out.append(json.loads(line[at + len(PREFIX):]))
    return out


def of_kind(recs, kind):
    return [r for r in recs if r["t"] == kind]


# torchrun's variables, which ablate sets for a program run of resources.devices > 1.
TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipIf(torch is None, "torch is not importable (install python3-torch)")
class GatedGptTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        cls.tmp = Path(cls._tmp.name)
        # A small deterministic text, big enough for the 90/10 split at block_size 32.
        words = ["in", "the", "beginning", "was", "light", "and", "water", "earth", "day"]
        text = " ".join(words[(i * 7 + i // 3) % len(words)] for i in range(4000))
        cls.dataset = cls.tmp / "text.txt"
        cls.dataset.write_text(text)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def params(self, **overrides):
        return {**TINY, "dataset": str(self.dataset), **overrides}

    def run_program(self, params, ckdir=None, args=(), stdin=None, **env):
        """(returncode, records, stdout, stderr) of one run of the program."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("ABLATE_") and k != "RANK"}
        base["PYTHONUNBUFFERED"] = "1"
        if ckdir is not None:
            base["ABLATE_CHECKPOINT_DIR"] = str(ckdir)
        base.update({k: str(v) for k, v in env.items()})
        proc = subprocess.run([sys.executable, str(PROGRAM)] + argv(params) + list(args),
                              env=base, input=stdin, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=300,
                              cwd=str(self.tmp))
        return proc.returncode, records(proc.stdout), proc.stdout, proc.stderr

    def losses(self, recs):
        return {r["step"]: r["loss"] for r in of_kind(recs, "step")}

    def start_ranks(self, params, ckdir, world, **env):
        """The program's `world` ranks as ablate starts them (torchrun's variables), running."""
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("ABLATE_") and k not in TORCHRUN}
        base.update(PYTHONUNBUFFERED="1", ABLATE_CHECKPOINT_DIR=str(ckdir), MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(free_port()), WORLD_SIZE=str(world),
                    LOCAL_WORLD_SIZE=str(world))
        base.update({k: str(v) for k, v in env.items()})
        return [subprocess.Popen([sys.executable, str(PROGRAM)] + argv(params),
                                 env=dict(base, RANK=str(rank), LOCAL_RANK=str(rank)),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True, cwd=str(self.tmp))
                for rank in range(world)]

    def finish_ranks(self, procs):
        """[(returncode, records, stdout, stderr)] of started ranks, by rank."""
        out = []
        try:
            for proc in procs:
                stdout, stderr = proc.communicate(timeout=300)
                out.append((proc.returncode, records(stdout), stdout, stderr))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return out

    def run_ranks(self, params, ckdir, world, **env):
        return self.finish_ranks(self.start_ranks(params, ckdir, world, **env))

    def assert_close_losses(self, got, expected, rel):
        self.assertEqual(sorted(got), sorted(expected))
        for step in expected:
            self.assertLessEqual(abs(got[step] - expected[step]), rel * abs(expected[step]),
                                 "step %d: %r vs %r" % (step, got[step], expected[step]))

    # ---- parameter counts -----------------------------------------------------------------------

    def test_count_formula_equals_the_model(self):
        configs = [{}, {"gate": "g1"}, {"ffn_hidden": 100}, {"n_layer": 3, "n_head": 2,
                   "n_embd": 48, "block_size": 16, "gate": "g1", "ffn_hidden": 7}]
        for cfg in configs:
            p = gated_gpt.resolve(cfg)
            model = gated_gpt.GPT(p)
            self.assertEqual(gated_gpt.count_params(p)["total"],
                             sum(t.numel() for t in model.parameters()), cfg)

    def test_count_mode(self):
        configs = [{"n_layer": 1, "n_embd": 32},
                   {"n_layer": 2, "n_embd": 64, "gate": "g1"},
                   {"n_layer": 2, "n_embd": 48, "n_head": 3, "ffn_hidden": 100, "gate": "g1"}]
        proc = subprocess.run([sys.executable, str(PROGRAM), "--count"],
                              input="".join(json.dumps(c) + "\n" for c in configs),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertEqual(len(lines), len(configs))
        for cfg, line in zip(configs, lines):
            n = sum(t.numel() for t in gated_gpt.GPT(gated_gpt.resolve(cfg)).parameters())
            self.assertEqual(json.loads(line), {"total": n, "activated": n}, cfg)
        gated = json.loads(lines[1])["total"] - json.loads(
            subprocess.run([sys.executable, str(PROGRAM), "--count"], input='{"n_layer": 2}\n',
                           stdout=subprocess.PIPE, universal_newlines=True).stdout)["total"]
        self.assertEqual(gated, 2 * 64 * 64)  # W_g: n_embd x n_embd per layer

    def test_count_mode_bad_line(self):
        for bad in ('{"n_layer": 1.5}', '{"nope": 1}', "[1]", "{oops"):
            proc = subprocess.run([sys.executable, str(PROGRAM), "--count"],
                                  input='{"n_layer": 1}\n' + bad + "\n",
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  universal_newlines=True, timeout=120)
            self.assertEqual(proc.returncode, 2, bad)
            self.assertEqual(len(proc.stdout.splitlines()), 1, bad)
            self.assertIn("line 2", proc.stderr, bad)

    def test_attention_is_causal(self):
        p = gated_gpt.resolve({"n_embd": 32, "n_head": 4, "gate": "g1"})
        torch.manual_seed(0)
        attn = gated_gpt.Attention(p)
        x = torch.randn(2, 10, 32)
        changed = x.clone()
        changed[:, 6:] = torch.randn(2, 4, 32)
        with torch.no_grad():
            a, b = attn(x), attn(changed)
        self.assertTrue(torch.allclose(a[:, :6], b[:, :6], atol=1e-6))
        self.assertFalse(torch.allclose(a[:, 6:], b[:, 6:]))
        self.assertTrue(0.0 < attn.gate_score.item() < 1.0)

    # ---- params ---------------------------------------------------------------------------------

    def test_param_layers(self):
        p = gated_gpt.resolve({"lr": 1, "gate": "g1"}, gated_gpt.parse_argv(
            ["--gate=none", "--dataset=123", "--n_layer=3", "--min_lr=1e-5"]))
        self.assertEqual((p["lr"], p["gate"], p["dataset"], p["n_layer"], p["min_lr"]),
                         (1.0, "none", "123", 3, 1e-5))
        for bad in ({"n_layer": "2"}, {"n_layer": True}, {"lr": "x"}, {"gate": "g2"},
                    {"n_head": 5}, {"unknown": 1}, {"dtype": "float64"}):
            with self.assertRaises(gated_gpt.ConfigError, msg=bad):
                gated_gpt.resolve(bad)

    def test_bad_params_are_permanent(self):
        cfg = self.tmp / "bad_config.json"
        cfg.write_text(json.dumps({"n_layerz": 2}))
        for params, env in ((self.params(n_layer=1.5), {}), (self.params(), {"ABLATE_CONFIG": cfg}),
                            (self.params(dataset=str(self.tmp / "missing.txt")), {})):
            rc, recs, _, _ = self.run_program(params, self.tmp / "ck-bad", **env)
            self.assertEqual(rc, 2, params)
            self.assertEqual([r["t"] for r in recs], ["error"], params)
            self.assertIs(recs[0]["permanent"], True)

    def test_bad_dataset_path(self):
        rc, recs, _, err = self.run_program(self.params(dataset=str(self.tmp / "no_such.txt")),
                                            self.tmp / "ck-nodata")
        self.assertEqual(rc, 2)
        self.assertEqual(recs, [{"t": "error", "permanent": True, "msg": recs[0]["msg"]}])
        self.assertIn("no_such.txt", recs[0]["msg"])
        self.assertIn("no_such.txt", err)

    # ---- training -------------------------------------------------------------------------------

    def test_run_reports_everything(self):
        ck = self.tmp / "ck-full"
        rc, recs, _, err = self.run_program(
            self.params(gate="g1", max_iters=30, eval_every=10, ckpt_every=20), ck)
        self.assertEqual(rc, 0, err)
        self.assertEqual(recs[0], dict(t="params", **gated_gpt.count_params(
            gated_gpt.resolve(self.params(gate="g1")))))
        steps = of_kind(recs, "step")
        self.assertEqual([r["step"] for r in steps], list(range(1, 31)))
        for r in steps:
            self.assertEqual(r["tokens"], 4 * 32)
            self.assertIsInstance(r["loss"], float)
            self.assertGreaterEqual(r["grad_norm"], 0.0)
            self.assertGreater(r["lr"], 0.0)
        self.assertLess(steps[-1]["loss"], steps[0]["loss"])
        evals = of_kind(recs, "eval")
        self.assertEqual([r["step"] for r in evals], [10, 20, 30])
        for r in evals:
            self.assertTrue(0.0 < r["metrics"]["gate_score"] < 1.0)
        self.assertEqual([r["step"] for r in of_kind(recs, "ckpt")], [20, 30])
        self.assertEqual(recs[-1], {"t": "end"})
        self.assertEqual((ck / "latest" / "ablate_step").read_text(), "30\n")

    def test_dense_eval_has_no_gate_score(self):
        rc, recs, _, err = self.run_program(self.params(max_iters=3), self.tmp / "ck-dense")
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(of_kind(recs, "eval")), 1)
        self.assertNotIn("metrics", of_kind(recs, "eval")[0])

    def test_pause_and_resume_match_an_uninterrupted_run(self):
        params = self.params(gate="g1", max_iters=30, eval_every=10, ckpt_every=10)
        rc, straight, _, err = self.run_program(params, self.tmp / "ck-straight")
        self.assertEqual(rc, 0, err)

        ck = self.tmp / "ck-paused"
        rc, first, _, err = self.run_program(params, ck, ABLATE_STOP_AT_STEP=15)
        self.assertEqual(rc, 0, err)
        self.assertEqual(max(self.losses(first)), 15)
        self.assertEqual(of_kind(first, "ckpt")[-1], {"t": "ckpt", "step": 15})
        self.assertEqual(of_kind(first, "eval")[-1]["step"], 15)
        self.assertNotIn({"t": "end"}, first)

        rc, second, _, err = self.run_program(params, ck, ABLATE_RESUME_FROM=15, ABLATE_ATTEMPT=2)
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(self.losses(second)), list(range(16, 31)))
        self.assertEqual(second[-1], {"t": "end"})
        expected = {s: v for s, v in self.losses(straight).items() if s > 15}
        self.assertEqual(self.losses(second), expected)
        self.assertEqual(of_kind(second, "eval")[-1], of_kind(straight, "eval")[-1])

    def test_rollback_skips_the_spike_steps(self):
        params = self.params(max_iters=20, ckpt_every=10)
        ck = self.tmp / "ck-rollback"
        rc, _, _, err = self.run_program(params, ck, ABLATE_STOP_AT_STEP=10)
        self.assertEqual(rc, 0, err)
        rc, recs, _, err = self.run_program(params, ck, ABLATE_RESUME_FROM=10,
                                            ABLATE_ROLLBACK="10-15")
        self.assertEqual(rc, 0, err)
        self.assertEqual(sorted(self.losses(recs)), list(range(16, 21)))
        self.assertEqual(recs[-1], {"t": "end"})

    def test_sigterm_checkpoints_and_exits_143(self):
        base = {k: v for k, v in os.environ.items() if not k.startswith("ABLATE_") and k != "RANK"}
        ck = self.tmp / "ck-sigterm"
        env = dict(base, PYTHONUNBUFFERED="1", ABLATE_CHECKPOINT_DIR=str(ck))
        proc = subprocess.Popen([sys.executable, str(PROGRAM)] +
                                argv(self.params(max_iters=10**6, ckpt_every=0, eval_every=0)),
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                universal_newlines=True)
        try:
            seen = []
            for line in proc.stdout:
                seen.append(line)
                if '"t":"step"' in line:
                    proc.send_signal(signal.SIGTERM)
                    break
            rest, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assertEqual(proc.returncode, 143, err)
        recs = records("".join(seen) + rest)
        last_step = of_kind(recs, "step")[-1]["step"]
        self.assertEqual(recs[-1], {"t": "ckpt", "step": last_step})
        self.assertNotIn({"t": "end"}, recs)
        self.assertEqual((ck / "latest" / "ablate_step").read_text(), "%d\n" % last_step)

    # ---- data parallel (WORLD_SIZE > 1: resources.devices, docs/program.md) -------------------

    def test_two_ranks_train_the_global_batch_of_one_process(self):
        # The same global batch split between 2 ranks (gloo on the CPU): the same losses as one
        # process up to float summation order, reported by rank 0 alone. Tolerance: a relative
        # 1e-4 on every step's loss and on the evaluations (measured: under 1e-6 over 30 steps).
        params = self.params(gate="g1", max_iters=30, eval_every=10, ckpt_every=10)
        rc, one, _, err = self.run_program(params, self.tmp / "ck-dp-one")
        self.assertEqual(rc, 0, err)
        (rc0, recs0, _, err0), (rc1, recs1, out1, err1) = self.run_ranks(
            params, self.tmp / "ck-dp-two", 2)
        self.assertEqual((rc0, rc1), (0, 0), err0 + err1)
        self.assertEqual(recs1, [], out1)  # only rank 0 reports
        self.assert_close_losses(self.losses(recs0), self.losses(one), 1e-4)
        self.assertEqual([r["tokens"] for r in of_kind(recs0, "step")], [4 * 32] * 30)
        evals = {r["step"]: r["val_loss"] for r in of_kind(recs0, "eval")}
        self.assert_close_losses(evals, {r["step"]: r["val_loss"] for r in of_kind(one, "eval")},
                                 1e-4)
        self.assertEqual(of_kind(recs0, "ckpt"), of_kind(one, "ckpt"))
        self.assertEqual(recs0[-1], {"t": "end"})
        # Rank 0 alone wrote the checkpoint, where one process would.
        self.assertEqual((self.tmp / "ck-dp-two" / "latest" / "ablate_step").read_text(), "30\n")
        self.assertEqual(sorted(p.name for p in (self.tmp / "ck-dp-two").iterdir()), ["latest"])

    def test_two_ranks_pause_together_and_resume_on_any_number_of_ranks(self):
        params = self.params(max_iters=30, eval_every=10, ckpt_every=10)
        (rc0, straight, _, err0), (rc1, _, _, err1) = self.run_ranks(
            params, self.tmp / "ck-dp-straight", 2)
        self.assertEqual((rc0, rc1), (0, 0), err0 + err1)

        ck = self.tmp / "ck-dp-paused"
        (rc0, first, _, err0), (rc1, _, _, err1) = self.run_ranks(
            params, ck, 2, ABLATE_STOP_AT_STEP=15)
        self.assertEqual((rc0, rc1), (0, 0), err0 + err1)  # both ranks pause at the rung
        self.assertEqual(max(self.losses(first)), 15)
        self.assertEqual(of_kind(first, "ckpt")[-1], {"t": "ckpt", "step": 15})
        self.assertNotIn({"t": "end"}, first)

        # Both ranks resume from rank 0's checkpoint: exactly the uninterrupted run's losses.
        (rc0, second, _, err0), (rc1, _, _, err1) = self.run_ranks(
            params, ck, 2, ABLATE_RESUME_FROM=15, ABLATE_ATTEMPT=2)
        self.assertEqual((rc0, rc1), (0, 0), err0 + err1)
        expected = {s: v for s, v in self.losses(straight).items() if s > 15}
        self.assertEqual(self.losses(second), expected)
        self.assertEqual(second[-1], {"t": "end"})

        # The checkpoint is a one-process run's: one process resumes from it too.
        ck_one = self.tmp / "ck-dp-to-one"
        self.finish_ranks(self.start_ranks(params, ck_one, 2, ABLATE_STOP_AT_STEP=15))
        rc, third, _, err = self.run_program(params, ck_one, ABLATE_RESUME_FROM=15)
        self.assertEqual(rc, 0, err)
        self.assert_close_losses(self.losses(third), expected, 1e-4)

    def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step(self):
        ck = self.tmp / "ck-dp-sigterm"
        procs = self.start_ranks(self.params(max_iters=10**6, ckpt_every=0, eval_every=0), ck, 2)
        seen = []
        try:
            for line in procs[0].stdout:
                seen.append(line)
                if '"t":"step"' in line:
                    procs[1].send_signal(signal.SIGTERM)  # rank 1 alone: the ranks agree
                    break
        finally:
            (rc0, rest, _, err0), (rc1, recs1, _, err1) = self.finish_ranks(procs)
        self.assertEqual((rc0, rc1), (143, 143), err0 + err1)
        recs = records("".join(seen)) + rest
        last_step = of_kind(recs, "step")[-1]["step"]
        self.assertEqual(recs[-1], {"t": "ckpt", "step": last_step})
        self.assertEqual(recs1, [])
        self.assertEqual((ck / "latest" / "ablate_step").read_text(), "%d\n" % last_step)

    def test_the_ranks_train_together_a_dead_rank_fails_the_others(self):
        # One process group: rank 0's next collective fails once rank 1 is gone.
        procs = self.start_ranks(self.params(max_iters=10**6, ckpt_every=0, eval_every=0),
                                 self.tmp / "ck-dp-dead", 2)
        try:
            for line in procs[0].stdout:
                if '"t":"step"' in line:
                    procs[1].kill()
                    break
        finally:
            (rc0, _, _, err0), (rc1, _, _, _) = self.finish_ranks(procs)
        self.assertEqual(rc1, -signal.SIGKILL)
        self.assertNotIn(rc0, (0, 2, 3, 143), err0)

    def test_batch_size_must_split_between_the_ranks(self):
        (rc0, recs0, _, _), (rc1, recs1, _, err1) = self.run_ranks(
            self.params(batch_size=3), self.tmp / "ck-dp-bad", 2)
        self.assertEqual((rc0, rc1), (2, 2))
        self.assertEqual([r["t"] for r in recs0], ["error"])
        self.assertIs(recs0[0]["permanent"], True)
        self.assertIn("batch_size 3 must be a multiple of WORLD_SIZE 2", recs0[0]["msg"])
        self.assertEqual(recs1, [])
        self.assertIn("batch_size 3", err1)

    def test_divergence_exits_3(self):
        rc, recs, _, _ = self.run_program(self.params(lr=1e30, min_lr=1e30, warmup=0,
                                                      max_iters=50), self.tmp / "ck-div")
        self.assertEqual(rc, 3)
        self.assertEqual([r["loss"] for r in of_kind(recs, "step")][-3:], ["nan"] * 3)
        self.assertEqual(recs[-1]["t"], "error")
        self.assertIs(recs[-1]["permanent"], False)


if __name__ == "__main__":
    unittest.main()
