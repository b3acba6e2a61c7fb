"""Report a training program's progress to ablate, and follow ablate's run protocol.

ablate launches a *program* (any training command), passes it settings through environment
variables and argv, and reads what it reports from lines on stdout or stderr. A report line
holds ``@ablate `` followed by one JSON object on a single line::

    @ablate {"t":"params","total":1083392,"activated":1083392}
    @ablate {"t":"step","step":12,"loss":3.1,"grad_norm":0.8,"lr":0.001,"tokens":4096}
    @ablate {"t":"eval","step":500,"val_loss":2.1,"metrics":{"gate_score":0.3}}
    @ablate {"t":"ckpt","step":500}
    @ablate {"t":"end"}
    @ablate {"t":"error","msg":"unknown param 'lrr'","permanent":true}

``grad_norm``, ``lr``, ``tokens`` (tokens processed in that step) and ``metrics`` are optional.
Numbers that are not finite are written as the strings ``"nan"``, ``"inf"`` and ``"-inf"``, so
every line is valid JSON. Only rank 0 reports (environment variable ``RANK`` unset or ``"0"``).
``ckpt`` is printed once a checkpoint is durable; ``end`` only after a run completed.

Exit codes: 0 normal (including a *pause*, see below), 2 permanent failure (a bad config: ablate
does not retry), 3 diverged. A program that stops on SIGTERM exits 143 (128 + SIGTERM).

The environment a program gets (every variable is optional; without any of them a program runs
as a plain local run and the report lines are harmless):

``ABLATE_RUN_ID``, ``ABLATE_ATTEMPT``
    The run's id and the attempt's number.
``ABLATE_SEED``
    The run's seed.
``ABLATE_CONFIG``
    Path of a JSON file holding the run's params object.
``ABLATE_CHECKPOINT_DIR``
    Where to keep checkpoints; the same for every attempt of a run.
``ABLATE_RESUME_FROM``
    Set to the step of the last durable checkpoint when an attempt resumes.
``ABLATE_STOP_AT_STEP``
    A tuning rung: when set and > 0, the program checkpoints after that step, prints the ckpt
    line and exits 0 *without* printing ``end`` (a pause; ablate may continue the run later).
``ABLATE_ROLLBACK``
    ``"A-B"``: the program was relaunched from its checkpoint at step A after a loss spike and
    must skip the data of steps A+1..B without training on it.

SIGTERM asks the program to checkpoint soon and exit; ablate sends the job again later.

Typical use::

    import ablate_report

    rep = ablate_report.report()
    params = {**DEFAULTS, **rep.config()}
    rep.params(total=n_params)
    start = 0
    found = rep.latest_checkpoint()
    if found:
        start, path = found
        load(path)
    for step in range(start + 1, max_steps + 1):
        loss = train_one_step(step)
        rep.step(step, loss, lr=lr, tokens=tokens_per_step)
        if rep.should_stop(step):
            with rep.checkpoint(step) as d:
                save(d)
            sys.exit(ablate_report.EXIT_TERMINATED if rep.sigterm_received() else 0)
    ...
    rep.end()

Checkpoint layout inside the checkpoint directory (see :meth:`Report.checkpoint`)::

    latest/               the durable checkpoint: the program's files plus ``ablate_step``
    latest/ablate_step    the checkpoint's step, as decimal text
    previous/             only while ``latest`` is being replaced (or after a crash in between)
    .tmp-<step>-<pid>-*/  a checkpoint being written

This module uses only the standard library (Python 3.8+).
"""

import contextlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, TextIO, Tuple

__all__ = [
    "PREFIX",
    "EXIT_OK",
    "EXIT_PERMANENT",
    "EXIT_DIVERGED",
    "EXIT_TERMINATED",
    "DEFAULT_CHECKPOINT_DIR",
    "MAX_MESSAGE_CHARS",
    "ConfigError",
    "Report",
    "report",
]

PREFIX = "@ablate "
"""What starts a report line's JSON."""

EXIT_OK = 0
EXIT_PERMANENT = 2
EXIT_DIVERGED = 3
EXIT_TERMINATED = 128 + int(signal.SIGTERM)

DEFAULT_CHECKPOINT_DIR = "ablate_checkpoints"
"""The checkpoint directory, relative to the working directory, when ABLATE_CHECKPOINT_DIR is unset."""

MAX_MESSAGE_CHARS = 4096
"""An error message is cut to this length, keeping report lines well under ablate's 64 KiB."""

STEP_FILE = "ablate_step"
LATEST = "latest"
PREVIOUS = "previous"
_TMP_PREFIX = ".tmp-"
_TMP_RE = re.compile(r"^\.tmp-\d+-(\d+)-")


class ConfigError(ValueError):
    """A setting from ablate's environment or the run's config is malformed (a permanent failure)."""


def _encode_float(value: Any) -> Any:
    """A float for JSON: itself when finite, else the string "nan", "inf" or "-inf"."""
    x = float(value)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _encode_int(value: Any, name: str) -> int:
    """An integer for JSON; accepts ints and integer-valued scalars (e.g. 0-d tensors)."""
    if isinstance(value, bool):
        raise TypeError("%s must be an integer, not bool" % name)
    if isinstance(value, int):
        return value
    x = float(value)
    if not x.is_integer():
        raise ValueError("%s must be an integer, got %r" % (name, value))
    return int(x)


def _fsync_path(path: Path, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    fd = os.open(str(path), flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every regular file and directory under root (root included)."""
    for dirpath, _dirnames, filenames in os.walk(str(root)):
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                _fsync_path(path)
        _fsync_path(Path(dirpath), directory=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_step(directory: Path) -> Optional[int]:
    """The step recorded in directory/ablate_step, or None when absent or malformed."""
    try:
        text = (directory / STEP_FILE).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not text.isdigit():
        return None
    return int(text)


class Report:
    """A program's side of ablate's protocol: report lines, settings, checkpoints and stopping.

    ``env`` is where settings are read from (``os.environ`` by default; read at each call),
    ``stream`` where report lines go (``sys.stdout`` by default, looked up at each write so that
    a redirected ``sys.stdout`` is followed). With ``handle_sigterm`` (the default) the
    constructor installs a SIGTERM handler that records the signal for :meth:`should_stop`; it
    calls a previously installed Python handler too, and :meth:`close` restores that one. A
    handler can only be installed from the main thread; elsewhere it is installed by the first
    :meth:`should_stop` that runs in the main thread.
    """

    def __init__(
        self,
        env: Optional[Mapping[str, str]] = None,
        stream: Optional[TextIO] = None,
        handle_sigterm: bool = True,
    ) -> None:
        self._env = env
        self._stream = stream
        self._lock = threading.Lock()
        self._sigterm = threading.Event()
        self._handle_sigterm = handle_sigterm
        self._installed = False
        self._previous_handler: Any = None
        if handle_sigterm:
            self._install_sigterm_handler()

    # ---- settings ------------------------------------------------------------------------------

    @property
    def env(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    def _get(self, name: str) -> Optional[str]:
        value = self.env.get(name)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def _get_int(self, name: str) -> Optional[int]:
        value = self._get(name)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise ConfigError("%s must be an integer, got %r" % (name, value)) from None

    def rank(self) -> int:
        """This process's rank: RANK, 0 when unset."""
        rank = self._get_int("RANK")
        return 0 if rank is None else rank

    def is_reporter(self) -> bool:
        """Whether this process writes report lines and checkpoints (rank 0)."""
        return self.rank() == 0

    def run_id(self) -> Optional[str]:
        """ABLATE_RUN_ID, None when unset."""
        return self._get("ABLATE_RUN_ID")

    def attempt(self) -> Optional[int]:
        """ABLATE_ATTEMPT, None when unset."""
        return self._get_int("ABLATE_ATTEMPT")

    def seed(self) -> Optional[int]:
        """ABLATE_SEED, None when unset."""
        return self._get_int("ABLATE_SEED")

    def config(self) -> Dict[str, Any]:
        """The run's params object from the JSON file named by ABLATE_CONFIG; {} when unset.

        Raises ConfigError when the file cannot be read or does not hold a JSON object.
        """
        path = self._get("ABLATE_CONFIG")
        if path is None:
            return {}
        try:
            with open(path, encoding="utf-8") as f:
                value = json.load(f)
        except OSError as e:
            raise ConfigError("cannot read ABLATE_CONFIG %s: %s" % (path, e.strerror or e)) from None
        except ValueError as e:
            raise ConfigError("ABLATE_CONFIG %s is not valid JSON: %s" % (path, e)) from None
        if not isinstance(value, dict):
            raise ConfigError("ABLATE_CONFIG %s must hold a JSON object, got %s"
                              % (path, type(value).__name__))
        return value

    def checkpoint_dir(self) -> Path:
        """ABLATE_CHECKPOINT_DIR, else ./ablate_checkpoints."""
        return Path(self._get("ABLATE_CHECKPOINT_DIR") or DEFAULT_CHECKPOINT_DIR)

    def resume_from(self) -> Optional[int]:
        """ABLATE_RESUME_FROM: the step ablate last saw made durable; None when unset."""
        return self._get_int("ABLATE_RESUME_FROM")

    def stop_at_step(self) -> Optional[int]:
        """ABLATE_STOP_AT_STEP when set and > 0 (the rung to pause at), else None."""
        step = self._get_int("ABLATE_STOP_AT_STEP")
        return step if step is not None and step > 0 else None

    def rollback(self) -> Optional[Tuple[int, int]]:
        """ABLATE_ROLLBACK "A-B" as (A, B): skip the data of steps A+1..B. None when unset."""
        value = self._get("ABLATE_ROLLBACK")
        if value is None:
            return None
        m = re.fullmatch(r"(\d+)-(\d+)", value)
        if not m or int(m.group(2)) < int(m.group(1)):
            raise ConfigError("ABLATE_ROLLBACK must be 'A-B' with 0 <= A <= B, got %r" % value)
        return int(m.group(1)), int(m.group(2))

    # ---- stopping ------------------------------------------------------------------------------

    def _install_sigterm_handler(self) -> None:
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._previous_handler = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._installed = True

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._sigterm.set()
        previous = self._previous_handler
        if callable(previous):
            previous(signum, frame)

    def close(self) -> None:
        """Restore the SIGTERM handler that was installed before this Report's."""
        if self._installed:
            previous = self._previous_handler
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            self._installed = False

    def sigterm_received(self) -> bool:
        """Whether SIGTERM arrived since this Report was created."""
        return self._sigterm.is_set()

    def at_rung(self, step: int) -> bool:
        """Whether step reached ABLATE_STOP_AT_STEP (never when that is unset)."""
        stop = self.stop_at_step()
        return stop is not None and step >= stop

    def should_stop(self, step: Optional[int] = None) -> bool:
        """Whether to checkpoint and exit now: SIGTERM arrived, or step reached the rung.

        After SIGTERM exit EXIT_TERMINATED; at a rung exit 0 without :meth:`end`.
        """
        if self._handle_sigterm:
            self._install_sigterm_handler()
        return self.sigterm_received() or (step is not None and self.at_rung(step))

    # ---- report lines --------------------------------------------------------------------------

    def emit(self, record: Mapping[str, Any]) -> None:
        """Write one report line holding record (a JSON object with "t"); only on rank 0."""
        if not self.is_reporter():
            return
        line = PREFIX + json.dumps(record, separators=(",", ":"), allow_nan=False)
        stream = self._stream if self._stream is not None else sys.stdout
        with self._lock:
            stream.write(line + "\n")
            stream.flush()

    def step(self, step: int, loss: float, grad_norm: Optional[float] = None,
             lr: Optional[float] = None, tokens: Optional[int] = None) -> None:
        """Report a training step: its loss, and optionally the gradient norm, the learning
        rate and the number of tokens processed in this step."""
        record: Dict[str, Any] = {"t": "step", "step": _encode_int(step, "step"),
                                  "loss": _encode_float(loss)}
        if grad_norm is not None:
            record["grad_norm"] = _encode_float(grad_norm)
        if lr is not None:
            record["lr"] = _encode_float(lr)
        if tokens is not None:
            record["tokens"] = _encode_int(tokens, "tokens")
        self.emit(record)

    def eval(self, step: int, val_loss: float,
             metrics: Optional[Mapping[str, float]] = None) -> None:
        """Report an evaluation at step: the validation loss and optional named metrics."""
        record: Dict[str, Any] = {"t": "eval", "step": _encode_int(step, "step"),
                                  "val_loss": _encode_float(val_loss)}
        if metrics:
            encoded = {}
            for name, value in metrics.items():
                if not isinstance(name, str):
                    raise TypeError("metric names must be str, got %r" % (name,))
                encoded[name] = _encode_float(value)
            record["metrics"] = encoded
        self.emit(record)

    def params(self, total: int, activated: Optional[int] = None) -> None:
        """Report the model's parameter count; activated defaults to total (a dense model)."""
        total = _encode_int(total, "total")
        activated = total if activated is None else _encode_int(activated, "activated")
        self.emit({"t": "params", "total": total, "activated": activated})

    def ckpt(self, step: int) -> None:
        """Report that a checkpoint at step is durable. :meth:`checkpoint` calls this itself;
        call it directly only for checkpoints made durable some other way."""
        self.emit({"t": "ckpt", "step": _encode_int(step, "step")})

    def end(self) -> None:
        """Report that the run completed."""
        self.emit({"t": "end"})

    def error(self, msg: str, permanent: bool = False) -> None:
        """Report a failure; permanent means retrying cannot help (e.g. a bad config).
        A message longer than MAX_MESSAGE_CHARS is cut, ending in "..."."""
        msg = str(msg)
        if len(msg) > MAX_MESSAGE_CHARS:
            msg = msg[:MAX_MESSAGE_CHARS - 3] + "..."
        self.emit({"t": "error", "msg": msg, "permanent": bool(permanent)})

    # ---- checkpoints ---------------------------------------------------------------------------

    def latest_checkpoint(self) -> Optional[Tuple[int, Path]]:
        """The durable checkpoint to resume from as (step, directory), None when there is none.

        That is ``latest``; when a crash came between moving ``latest`` aside and renaming the
        new checkpoint into place, it is ``previous``.
        """
        root = self.checkpoint_dir()
        for name in (LATEST, PREVIOUS):
            directory = root / name
            step = _read_step(directory)
            if step is not None:
                return step, directory
        return None

    @contextlib.contextmanager
    def checkpoint(self, step: int) -> Iterator[Path]:
        """Make a durable checkpoint at step: yields an empty directory to write it into.

        On rank 0 the directory is ``<checkpoint_dir>/.tmp-<step>-<pid>-<random>``. When the
        block ends normally this writes ``ablate_step``, fsyncs every file and directory in it,
        moves the current ``latest`` aside to ``previous``, renames the new directory to
        ``latest``, fsyncs the checkpoint directory, removes ``previous`` and reports the ckpt
        line. If the block raises, the new directory is removed, ``latest`` stays as it was and
        the exception propagates. Other ranks get a scratch directory in the system's temporary
        directory, removed afterwards: they neither touch the checkpoint directory nor report.
        """
        step = _encode_int(step, "step")
        if step < 0:
            raise ValueError("step must be >= 0, got %d" % step)
        if not self.is_reporter():
            scratch = Path(tempfile.mkdtemp(prefix="ablate-ckpt-rank%d-" % self.rank()))
            try:
                yield scratch
            finally:
                shutil.rmtree(str(scratch), ignore_errors=True)
            return

        root = self.checkpoint_dir()
        root.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temporaries(root)
        tmp = self._make_temporary(root, step)
        try:
            yield tmp
            with open(str(tmp / STEP_FILE), "w", encoding="ascii") as f:
                f.write("%d\n" % step)
            _fsync_tree(tmp)
            self._commit(root, tmp)
        except BaseException:
            shutil.rmtree(str(tmp), ignore_errors=True)
            raise
        self.ckpt(step)

    @staticmethod
    def _make_temporary(root: Path, step: int) -> Path:
        """A new, empty directory root/.tmp-<step>-<pid>-<random> (made with the umask's mode,
        unlike tempfile.mkdtemp's 0700, so that a checkpoint has ordinary permissions)."""
        while True:
            path = root / ("%s%d-%d-%s" % (_TMP_PREFIX, step, os.getpid(), secrets.token_hex(4)))
            try:
                os.mkdir(str(path))
            except FileExistsError:
                continue
            return path

    @staticmethod
    def _commit(root: Path, tmp: Path) -> None:
        """Replace root/latest by tmp, crash-safely: at every moment latest or previous is a
        complete checkpoint."""
        latest, previous = root / LATEST, root / PREVIOUS
        if latest.exists():
            if previous.exists():
                # A leftover from an earlier crash; latest is complete, so previous is not needed.
                shutil.rmtree(str(previous))
            os.rename(str(latest), str(previous))
            _fsync_path(root, directory=True)
        os.rename(str(tmp), str(latest))
        _fsync_path(root, directory=True)
        if previous.exists():
            shutil.rmtree(str(previous))
            _fsync_path(root, directory=True)

    @staticmethod
    def _remove_stale_temporaries(root: Path) -> None:
        """Remove checkpoint directories left half-written by processes that no longer run."""
        for entry in root.iterdir():
            m = _TMP_RE.match(entry.name)
            if not m or not entry.is_dir():
                continue
            pid = int(m.group(1))
            if pid != os.getpid() and not _pid_alive(pid):
                shutil.rmtree(str(entry), ignore_errors=True)


_default: Optional[Report] = None
_default_lock = threading.Lock()


def report() -> Report:
    """The process's shared Report (reading os.environ, writing to stdout), made on first use.

    Call it first from the main thread, early, so that its SIGTERM handler is in place.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = Report()
        return _default
