"""What every benchmark shares: the machine's description, its measured matmul
rate (the denominator of MFU on a CPU), and tables rendered as Markdown.
"""

import os
import platform
import time

import torch



def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info():
    info = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


class Table:
    """A titled table of rows; rendered as Markdown for BENCHMARKS.md."""

    def __init__(self, title, columns, note=""):
        self.title = title
        self.columns = list(columns)
        self.rows = []
        self.note = note

    def add_row(self, *values):
        assert len(values) == len(self.columns), f"{len(values)} values for columns {self.columns}"
        self.rows.append([format_cell(v) for v in values])

    def to_markdown(self):
        lines = [f"#### {self.title}", ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines)


def format_cell(value):
    if isinstance(value, float):
        if value == 0 or 1e-3 <= abs(value) < 1e6:
            return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
        return f"{value:.3e}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def time_it(fn, repeat=1):
    """Best wall time of `repeat` calls of fn(), in seconds."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
