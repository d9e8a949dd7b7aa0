"""Running pipeline.py's stages: each command a child process whose output goes to the
stage's log, a progress line with an ETA, a done-marker per finished stage, Ctrl-C.

    RUN/logs/NAME.log         everything a stage's commands printed, every attempt
    RUN/stages/NAME.json      the done-marker: commands, wall and CPU time, peak memory,
                              figures; written atomically once the stage succeeded
    RUN/stages/NAME.partial.json   time spent by interrupted attempts, added on finishing

Children start in their own session, so a terminal's Ctrl-C reaches this process
only; it hands one SIGINT (or the SIGTERM it got) to the running child, which stops as
it always does (train.py and rl.py save a checkpoint), waits for it and exits 130
without a marker: the same command resumes that stage. Time and memory come from
os.wait4, the child's own rusage (its CPU seconds and peak resident set, its waited-for
children included, as RUSAGE_CHILDREN counts them).
"""

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from gptkit.ops.atomic import atomic_write
from gptkit.ops.errors import RunFailed, UserError

HEARTBEAT_S = 30  # without a terminal, a progress line at least this often


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: the stage stopped as its command stops, without its marker."""


def format_duration(seconds):
    """1h02m, 3m07s, 12s: as train.py's log lines write their eta (gptkit/train/logger.py)."""
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def parse_duration(text):
    """format_duration's text back to seconds: '1h02m' -> 3720."""
    parts = dict((unit, int(n)) for n, unit in re.findall(r"(\d+)([hms])", text))
    return 3600 * parts.get("h", 0) + 60 * parts.get("m", 0) + parts.get("s", 0)


ETA_IN_LINE = re.compile(r"\beta ((?:\d+h)?(?:\d+m)?(?:\d+s)?)\b")


class Progress:
    """The console: a line per stage start and end; meanwhile, on a terminal, one status
    line rewritten in place, else a line every HEARTBEAT_S seconds. The ETA is the
    stated time of the stages left (sizes.py's expected_s), scaled by how fast this
    machine ran the stages done so far; in a stage whose command prints its own eta
    (train.py), that one."""

    def __init__(self, expected, stream=sys.stdout):
        self.expected = expected
        self.stream = stream
        self.tty = stream.isatty()
        self.spent = {}  # stage -> wall seconds, for the stages run in this invocation
        self.stage, self.started, self.last_line, self.last_print, self.line_at = None, 0.0, "", 0.0, 0.0

    def speed(self):
        """Wall seconds here per stated second, from the stages done that were stated to take a
        minute or more (a few seconds' stage is mostly start-up: no guide to the long ones)."""
        done = [s for s in self.spent if self.expected.get(s, 0) >= 60]
        if not done:
            return 1.0
        return sum(self.spent[s] for s in done) / sum(self.expected[s] for s in done)

    def eta(self, remaining_stages):
        now = time.monotonic()
        own = ETA_IN_LINE.search(self.last_line)
        if own:  # the command's own eta, counted down since it printed it
            current = max(0.0, parse_duration(own.group(1)) - (now - self.line_at))
        else:
            current = max(0.0, self.expected.get(self.stage, 0) * self.speed() - (now - self.started))
        return current + self.speed() * sum(self.expected.get(s, 0) for s in remaining_stages)

    def start(self, number, total, stage, commands):
        self.stage, self.started, self.last_line = stage.name, time.monotonic(), ""
        self.last_print = self.started
        self.say(f"[{number}/{total}] {stage.title}")
        for argv in commands:
            self.say(f"  $ {shown(argv)}")

    def line(self, text):
        if text.strip():
            self.last_line, self.line_at = text.strip(), time.monotonic()

    def tick(self, remaining_stages, force=False):
        now = time.monotonic()
        status = (f"  {self.stage} {format_duration(now - self.started)}, pipeline eta "
                  f"{format_duration(self.eta(remaining_stages))} | {self.last_line[:100]}")
        if self.tty:
            width = os.get_terminal_size(self.stream.fileno()).columns if self.stream.isatty() else 120
            self.stream.write("\r\033[K" + status[: width - 1])
            self.stream.flush()
        elif force or now - self.last_print >= HEARTBEAT_S:
            self.say(status)
            self.last_print = now

    def end(self, stage, marker):
        self.spent[stage.name] = marker["wall_s"]
        figures = ", ".join(f"{k} {round(v, 4) if isinstance(v, float) else v}" for k, v in marker["figures"].items()
                            if isinstance(v, (int, float, str)))
        self.say(f"  done in {format_duration(marker['wall_s'])} (CPU {format_duration(marker['cpu_s'])}, "
                 f"peak {marker['peak_rss_mb']:,.0f} MB){': ' + figures if figures else ''}")

    def say(self, text):
        if self.tty:
            self.stream.write("\r\033[K")
        print(text, file=self.stream, flush=True)


class Signals:
    """SIGINT and SIGTERM while the pipeline runs: remembered, and handed to the child."""

    def __init__(self):
        self.received = None
        self.child = None  # the running child's Popen

    def __enter__(self):
        self.previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def handle(self, signum, frame):
        self.received = signum
        self.forward()

    def adopt(self, child):
        """Hand signals to `child` from now on, and the one that came while it was being started."""
        self.child = child
        self.forward()

    def forward(self):
        if self.received is not None and self.child is not None and self.child.returncode is None:
            try:
                os.killpg(self.child.pid, self.received)  # its own session: the group is its pid
            except ProcessLookupError:
                pass

    def check(self):
        if self.received is not None:
            raise Interrupted()


def read_chunks(stream, out):
    """The child's output into `out` as text, piece by piece as it comes; None at its end."""
    for chunk in iter(lambda: stream.read1(1 << 16), b""):
        out.put(chunk.decode("utf-8", "replace"))
    out.put(None)


def run_command(argv, log, progress, signals, remaining):
    """Run one command, its output into `log`; (exit code, its text, wall s, CPU s, peak RSS bytes)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    started = time.monotonic()
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, env=env)
    signals.adopt(child)
    pieces = queue.Queue()
    threading.Thread(target=read_chunks, args=(child.stdout, pieces), daemon=True).start()
    text = []
    try:
        while (piece := next_piece(pieces, progress, remaining)) is not None:
            text.append(piece)
            log.write(piece)
            log.flush()
            for line in re.split(r"[\r\n]", piece):
                progress.line(line)
    except BaseException:  # the pipeline itself failed (a full disk for the log): no child left running alone
        os.killpg(child.pid, signal.SIGTERM)
        child.wait()
        raise
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    child.stdout.close()
    signals.child = None
    cpu = usage.ru_utime + usage.ru_stime
    return child.returncode, "".join(text), time.monotonic() - started, cpu, usage.ru_maxrss * 1024


def next_piece(pieces, progress, remaining):
    """The next piece of output (None at the end), ticking the progress line at least every second."""
    while True:
        try:
            piece = pieces.get(timeout=1.0)
        except queue.Empty:
            progress.tick(remaining)
            continue
        progress.tick(remaining)
        return piece


def shown(argv):
    """A command as a reader would type it: `python` for this interpreter."""
    return shlex.join(["python" if a == sys.executable else a for a in argv])


def last_error(text):
    lines = [line for line in re.split(r"[\r\n]", text) if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["(nothing printed)"])[-1]


def read_json(path, default=None):
    return json.loads(path.read_text()) if path.is_file() else default


def write_json(path, data):
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2) + "\n")


def run_stage(run, stage, progress, signals, remaining):
    """Run `stage`'s commands in order; its done-marker (also written to RUN/stages)."""
    stages_dir, logs = run.folder / "stages", run.folder / "logs"
    stages_dir.mkdir(parents=True, exist_ok=True)
    logs.mkdir(exist_ok=True)
    partial_path = stages_dir / f"{stage.name}.partial.json"
    spent = read_json(partial_path, {"wall_s": 0.0, "cpu_s": 0.0, "peak_rss_bytes": 0, "attempts": 0})
    commands = stage.commands(run)
    outputs, argvs = [], []
    wall = cpu = peak = 0.0
    log_path = logs / f"{stage.name}.log"
    try:
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} attempt {spent['attempts'] + 1}\n")
            for command in commands:
                signals.check()
                argvs.append(shown(command.argv))
                if command.output is not None and command.output.exists():
                    log.write(f"$ {shown(command.argv)}\n{command.output} is there already: kept\n")
                    outputs.append("")
                    continue
                log.write(f"$ {shown(command.argv)}\n")
                log.flush()
                code, text, w, c, p = run_command(command.argv, log, progress, signals, remaining)
                wall, cpu, peak = wall + w, cpu + c, max(peak, p)
                outputs.append(text)
                signals.check()
                if code != 0 and not (command.may_fail and code == 2):
                    failed = UserError if code == 2 else RunFailed  # a mistake in what it was given: exit 2 too
                    raise failed(f"stage {stage.name} failed (exit {code}): {last_error(text)} "
                                 f"(the whole output: {log_path})")
        figures = stage.figures(run, outputs, log_path.read_text(encoding="utf-8"))
    except (Interrupted, RunFailed, UserError):
        write_json(partial_path, {"wall_s": spent["wall_s"] + wall, "cpu_s": spent["cpu_s"] + cpu,
                                  "peak_rss_bytes": max(spent["peak_rss_bytes"], peak),
                                  "attempts": spent["attempts"] + 1, "commands": spent.get("commands", []) + argvs})
        raise
    marker = {"stage": stage.name, "title": stage.title, "commands": spent.get("commands", []) + argvs,
              "resumes": stage.resumes,
              "wall_s": spent["wall_s"] + wall, "cpu_s": spent["cpu_s"] + cpu,
              "peak_rss_mb": max(spent["peak_rss_bytes"], peak) / 2**20, "attempts": spent["attempts"] + 1,
              "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "log": str(log_path.relative_to(run.folder)),
              "figures": figures}
    write_json(stages_dir / f"{stage.name}.json", marker)
    partial_path.unlink(missing_ok=True)
    return marker


def run_stages(run, stages, progress):
    """Every stage without a done-marker, in order; the markers of all of them."""
    markers = {}
    with Signals() as signals:
        for number, stage in enumerate(stages, 1):
            marker = read_json(run.folder / "stages" / f"{stage.name}.json")
            if marker is not None:
                progress.say(f"[{number}/{len(stages)}] {stage.title}: done before, skipped")
                markers[stage.name] = marker
                continue
            signals.check()
            remaining = [s.name for s in stages[number:]]
            progress.start(number, len(stages), stage, [c.argv for c in stage.commands(run)])
            try:
                markers[stage.name] = run_stage(run, stage, progress, signals, remaining)
            except Interrupted:
                progress.say(f"interrupted during {stage.title.lower()}: run the same command again to go on "
                             f"({stage.resumes})")
                raise
            progress.end(stage, markers[stage.name])
    return markers
