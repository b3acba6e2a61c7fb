"""Unit tests of python/ablate_report.py (stdlib only).

Run from the repository root: /usr/bin/python3 -m unittest discover -s tests/python -v
"""
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import ablate_report  # noqa: E402
from ablate_report import ConfigError, Report  # noqa: E402


def strict_json(text):
    """json.loads that rejects NaN and Infinity, as ablate's parser does."""
    def reject(constant):
        raise ValueError("non-standard JSON constant %s" % constant)
    return json.loads(text, parse_constant=reject)


class ReportCase(unittest.TestCase):
    def setUp(self):
        self._sigterm = signal.getsignal(signal.SIGTERM)
        self.out = io.StringIO()
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.root = Path(self.tmp.name)

    def tearDown(self):
        signal.signal(signal.SIGTERM, self._sigterm)

    def make(self, handle_sigterm=False, **env):
        env = {k: str(v) for k, v in env.items()}
        return Report(env=env, stream=self.out, handle_sigterm=handle_sigterm)

    def records(self):
        lines = self.out.getvalue().splitlines()
        for line in lines:
            self.assertTrue(line.startswith(ablate_report.PREFIX), line)
        return [strict_json(line[len(ablate_report.PREFIX):]) for line in lines]


class LineFormatTest(ReportCase):
    def test_step_line_is_exact(self):
        rep = self.make()
        rep.step(12, 3.1, grad_norm=0.8, lr=0.001, tokens=4096)
        self.assertEqual(
            self.out.getvalue(),
            '@ablate {"t":"step","step":12,"loss":3.1,"grad_norm":0.8,"lr":0.001,"tokens":4096}\n')

    def test_optional_fields_are_omitted(self):
        rep = self.make()
        rep.step(1, 2.5)
        rep.eval(500, 2.1)
        self.assertEqual(self.records(), [{"t": "step", "step": 1, "loss": 2.5},
                                          {"t": "eval", "step": 500, "val_loss": 2.1}])

    def test_every_kind_of_line(self):
        rep = self.make()
        rep.params(1083392)
        rep.params(100, activated=40)
        rep.eval(500, 2.1, metrics={"m_act": 12.5, "gate_score": 0.3})
        rep.ckpt(500)
        rep.error("bad config", permanent=True)
        rep.error("flaky")
        rep.end()
        self.assertEqual(self.records(), [
            {"t": "params", "total": 1083392, "activated": 1083392},
            {"t": "params", "total": 100, "activated": 40},
            {"t": "eval", "step": 500, "val_loss": 2.1,
             "metrics": {"m_act": 12.5, "gate_score": 0.3}},
            {"t": "ckpt", "step": 500},
            {"t": "error", "msg": "bad config", "permanent": True},
            {"t": "error", "msg": "flaky", "permanent": False},
            {"t": "end"},
        ])

    def test_one_line_per_record_even_with_newlines_in_messages(self):
        rep = self.make()
        rep.error("line one\nline two")
        self.assertEqual(len(self.out.getvalue().splitlines()), 1)
        self.assertEqual(self.records()[0]["msg"], "line one\nline two")

    def test_long_messages_are_cut(self):
        rep = self.make()
        rep.error("x" * 100000)
        msg = self.records()[0]["msg"]
        self.assertEqual(len(msg), ablate_report.MAX_MESSAGE_CHARS)
        self.assertTrue(msg.endswith("..."))

    def test_non_finite_numbers_are_strings(self):
        rep = self.make()
        rep.step(3, float("nan"), grad_norm=float("inf"), lr=float("-inf"), tokens=8)
        rep.eval(3, float("inf"), metrics={"m": float("nan")})
        step, ev = self.records()  # strict_json rejects NaN/Infinity literals
        self.assertEqual((step["loss"], step["grad_norm"], step["lr"]), ("nan", "inf", "-inf"))
        self.assertEqual((ev["val_loss"], ev["metrics"]), ("inf", {"m": "nan"}))

    def test_numbers_are_coerced(self):
        rep = self.make()
        rep.step(5.0, 2, tokens=64.0)
        self.assertEqual(self.records(), [{"t": "step", "step": 5, "loss": 2.0, "tokens": 64}])
        self.assertIsInstance(self.records()[0]["loss"], float)

    def test_bad_values_are_rejected(self):
        rep = self.make()
        with self.assertRaises(TypeError):
            rep.eval(1, 1.0, metrics={3: 1.0})
        with self.assertRaises(ValueError):
            rep.step(1.5, 1.0)
        with self.assertRaises(TypeError):
            rep.step(True, 1.0)
        self.assertEqual(self.out.getvalue(), "")

    def test_only_rank_zero_reports(self):
        for rank, expected in (("1", 0), ("3", 0), ("0", 1), ("", 1)):
            self.out = io.StringIO()
            rep = self.make(RANK=rank)
            rep.step(1, 1.0)
            rep.end()
            self.assertEqual(len(self.out.getvalue().splitlines()), 2 * expected, rank)

    def test_default_stream_is_stdout(self):
        code = ("import sys; sys.path.insert(0, %r); import ablate_report as a; "
                "a.report().step(1, 0.5); a.report().end()" % str(Path(ablate_report.__file__).parent))
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABLATE_") and k != "RANK"}
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                             stdout=subprocess.PIPE, universal_newlines=True).stdout
        self.assertEqual(out, '@ablate {"t":"step","step":1,"loss":0.5}\n@ablate {"t":"end"}\n')

    def test_report_is_a_singleton(self):
        self.assertIs(ablate_report.report(), ablate_report.report())


class SettingsTest(ReportCase):
    def test_no_environment(self):
        rep = self.make()
        self.assertEqual(rep.config(), {})
        self.assertEqual(rep.checkpoint_dir(), Path("ablate_checkpoints"))
        for getter in (rep.seed, rep.attempt, rep.run_id, rep.resume_from, rep.stop_at_step,
                       rep.rollback):
            self.assertIsNone(getter(), getter.__name__)
        self.assertFalse(rep.at_rung(10**9))
        self.assertFalse(rep.should_stop(10**9))
        self.assertTrue(rep.is_reporter())

    def test_values(self):
        rep = self.make(ABLATE_RUN_ID="r-7", ABLATE_ATTEMPT=2, ABLATE_SEED=41,
                        ABLATE_CHECKPOINT_DIR=self.root / "ck", ABLATE_RESUME_FROM=500)
        self.assertEqual((rep.run_id(), rep.attempt(), rep.seed(), rep.resume_from()),
                         ("r-7", 2, 41, 500))
        self.assertEqual(rep.checkpoint_dir(), self.root / "ck")

    def test_bad_integer(self):
        with self.assertRaises(ConfigError):
            self.make(ABLATE_SEED="x").seed()

    def test_config(self):
        path = self.root / "params.json"
        path.write_text(json.dumps({"lr": 0.01, "gate": "g1"}))
        self.assertEqual(self.make(ABLATE_CONFIG=path).config(), {"lr": 0.01, "gate": "g1"})

    def test_bad_config(self):
        (self.root / "list.json").write_text("[1, 2]")
        (self.root / "broken.json").write_text("{")
        for name in ("list.json", "broken.json", "missing.json"):
            with self.assertRaises(ConfigError, msg=name):
                self.make(ABLATE_CONFIG=self.root / name).config()

    def test_stop_at_step(self):
        self.assertIsNone(self.make(ABLATE_STOP_AT_STEP=0).stop_at_step())
        rep = self.make(ABLATE_STOP_AT_STEP=15)
        self.assertEqual(rep.stop_at_step(), 15)
        self.assertFalse(rep.at_rung(14))
        self.assertTrue(rep.at_rung(15))
        self.assertFalse(rep.should_stop(14))
        self.assertTrue(rep.should_stop(15))
        self.assertFalse(rep.should_stop())
        self.assertFalse(rep.sigterm_received())

    def test_rollback(self):
        self.assertEqual(self.make(ABLATE_ROLLBACK="500-530").rollback(), (500, 530))
        self.assertEqual(self.make(ABLATE_ROLLBACK=" 7-7 ").rollback(), (7, 7))
        for bad in ("530-500", "5", "a-b", "-1-3"):
            with self.assertRaises(ConfigError, msg=bad):
                self.make(ABLATE_ROLLBACK=bad).rollback()


class SigtermTest(ReportCase):
    def test_sigterm_sets_should_stop(self):
        rep = self.make(handle_sigterm=True)
        self.assertFalse(rep.should_stop())
        os.kill(os.getpid(), signal.SIGTERM)
        self.assertTrue(rep.sigterm_received())
        self.assertTrue(rep.should_stop())
        self.assertTrue(rep.should_stop(0))
        rep.close()
        self.assertEqual(signal.getsignal(signal.SIGTERM), self._sigterm)

    def test_previous_handler_is_chained_and_restored(self):
        calls = []

        def previous(signum, frame):
            calls.append(signum)

        signal.signal(signal.SIGTERM, previous)
        rep = self.make(handle_sigterm=True)
        os.kill(os.getpid(), signal.SIGTERM)
        self.assertTrue(rep.should_stop())
        self.assertEqual(calls, [signal.SIGTERM])
        rep.close()
        self.assertIs(signal.getsignal(signal.SIGTERM), previous)

    def test_without_handler(self):
        rep = self.make(handle_sigterm=False)
        self.assertEqual(signal.getsignal(signal.SIGTERM), self._sigterm)
        self.assertFalse(rep.should_stop())


class CheckpointTest(ReportCase):
    def setUp(self):
        super().setUp()
        self.ck = self.root / "ck"
        self.rep = self.make(ABLATE_CHECKPOINT_DIR=self.ck)

    def save(self, step, content):
        with self.rep.checkpoint(step) as d:
            self.assertEqual(list(d.iterdir()), [])
            self.assertEqual(d.parent, self.ck)
            (d / "model.bin").write_text(content)
            (d / "sub").mkdir()
            (d / "sub" / "opt.bin").write_text(content)

    def entries(self):
        return sorted(p.name for p in self.ck.iterdir())

    def test_none_before_the_first(self):
        self.assertIsNone(self.rep.latest_checkpoint())

    def test_checkpoint_becomes_latest(self):
        self.save(50, "a")
        self.assertEqual(self.entries(), ["latest"])
        self.assertEqual((self.ck / "latest" / "ablate_step").read_text(), "50\n")
        self.assertEqual((self.ck / "latest" / "sub" / "opt.bin").read_text(), "a")
        self.assertEqual(self.rep.latest_checkpoint(), (50, self.ck / "latest"))
        self.assertEqual(self.records(), [{"t": "ckpt", "step": 50}])

        self.save(100, "b")
        self.assertEqual(self.entries(), ["latest"])
        self.assertEqual(self.rep.latest_checkpoint(), (100, self.ck / "latest"))
        self.assertEqual((self.ck / "latest" / "model.bin").read_text(), "b")
        self.assertEqual(self.records(), [{"t": "ckpt", "step": 50}, {"t": "ckpt", "step": 100}])

    def test_exception_leaves_latest_intact(self):
        self.save(50, "a")
        with self.assertRaises(RuntimeError):
            with self.rep.checkpoint(100) as d:
                (d / "model.bin").write_text("half")
                raise RuntimeError("disk full")
        self.assertEqual(self.entries(), ["latest"])
        self.assertEqual(self.rep.latest_checkpoint(), (50, self.ck / "latest"))
        self.assertEqual((self.ck / "latest" / "model.bin").read_text(), "a")
        self.assertEqual(self.records(), [{"t": "ckpt", "step": 50}])

    def test_exception_before_any_checkpoint(self):
        with self.assertRaises(KeyboardInterrupt):
            with self.rep.checkpoint(10):
                raise KeyboardInterrupt
        self.assertEqual(self.entries(), [])
        self.assertIsNone(self.rep.latest_checkpoint())
        self.assertEqual(self.records(), [])

    def test_crash_between_renames_resumes_from_previous(self):
        self.save(50, "a")
        os.rename(str(self.ck / "latest"), str(self.ck / "previous"))  # as a crash would leave it
        self.assertEqual(self.rep.latest_checkpoint(), (50, self.ck / "previous"))
        self.save(100, "b")
        self.assertEqual(self.entries(), ["latest"])
        self.assertEqual(self.rep.latest_checkpoint(), (100, self.ck / "latest"))

    def test_stale_previous_is_replaced(self):
        self.save(50, "a")
        (self.ck / "previous").mkdir()
        (self.ck / "previous" / "ablate_step").write_text("10\n")
        self.assertEqual(self.rep.latest_checkpoint(), (50, self.ck / "latest"))
        self.save(100, "b")
        self.assertEqual(self.entries(), ["latest"])

    def test_stale_temporaries_of_dead_processes_are_removed(self):
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait()
        self.ck.mkdir()
        stale = self.ck / (".tmp-40-%d-0badf00d" % child.pid)
        stale.mkdir()
        (stale / "model.bin").write_text("partial")
        live = self.ck / (".tmp-40-%d-0badf00d" % os.getppid())
        live.mkdir()
        self.save(50, "a")
        self.assertEqual(self.entries(), [live.name, "latest"])

    def test_other_ranks_do_not_touch_the_checkpoint_dir(self):
        rep = self.make(ABLATE_CHECKPOINT_DIR=self.ck, RANK=1)
        with rep.checkpoint(50) as d:
            self.assertTrue(d.is_dir())
            self.assertNotEqual(d.parent, self.ck)
            (d / "model.bin").write_text("x")
        self.assertFalse(d.exists())
        self.assertFalse(self.ck.exists())
        self.assertIsNone(rep.latest_checkpoint())
        self.assertEqual(self.out.getvalue(), "")


if __name__ == "__main__":
    unittest.main()
