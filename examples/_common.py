"""Small helpers the examples share: a one-line progress display and a per-call timer.

Not part of morphjit; the examples import it as ``_common`` (Python puts the script's own folder
on ``sys.path`` when you run ``python examples/NAME.py``).
"""
import sys
import time


class Progress:
    """Shows ``step i/n [####......]  loss ...  N steps/s``.

    The first step is reported with its own time (it includes tracing and compiling, or loading
    the compiled step from the disk cache); the rate counts the steps after it.

    On a terminal the same line is redrawn in place (at most ten times a second); when the output
    is a file or a pipe (CI logs, tests) it prints a plain line every ``every`` steps instead.
    """

    def __init__(self, total, every=None, stream=None, label="step"):
        self.total, self.label = total, label
        self.stream = stream if stream is not None else sys.stdout
        self.tty = self.stream.isatty()
        self.every = every or max(1, total // 5)
        self.start = self.last_draw = time.perf_counter()
        self.first_done = None

    def update(self, step, loss):
        """Report that ``step`` (0-based) finished with loss ``loss``."""
        now = time.perf_counter()
        done = step + 1
        last = done == self.total
        if self.first_done is None:
            self.first_done = now
            speed = f"first call {now - self.start:.2f} s"
        else:
            speed = f"{(done - 1) / max(now - self.first_done, 1e-9):,.0f} steps/s"
        filled = round(20 * done / self.total)
        bar = "[" + "#" * filled + "." * (20 - filled) + "]"
        line = f"{self.label} {done:>{len(str(self.total))}}/{self.total} {bar}  loss {float(loss):.5f}  {speed}"
        if self.tty:
            if last or now - self.last_draw > 0.1:
                self.stream.write("\r" + line + "\033[K")   # \033[K clears what the old line left over
                self.stream.flush()
                self.last_draw = now
        elif step % self.every == 0 or last:
            self.stream.write(line + "\n")

    def close(self):
        if self.tty:
            self.stream.write("\n")
        self.stream.flush()


def time_per_call(fn, *args, min_time=0.2, repeat=5):
    """Seconds per call of ``fn(*args)``: the best of ``repeat`` runs of a loop lasting ``min_time``.

    The best run is the one least disturbed by the rest of the machine, the usual way to time
    short functions (as ``timeit`` does).
    """
    fn(*args)                                   # warm up (and compile, for a morphjit step)
    number, elapsed = 1, 0.0
    while True:                                 # find a loop length that lasts about min_time
        start = time.perf_counter()
        for _ in range(number):
            fn(*args)
        elapsed = time.perf_counter() - start
        if elapsed >= min_time / repeat:
            break
        number *= 2
    best = elapsed / number
    for _ in range(repeat - 1):
        start = time.perf_counter()
        for _ in range(number):
            fn(*args)
        best = min(best, (time.perf_counter() - start) / number)
    return best


def report_speed(compiled_s, numpy_s, what="step"):
    """One line comparing the compiled step with the hand-written NumPy one."""
    print(f"per {what}: morphjit {compiled_s * 1e6:8.1f} us | hand-written NumPy {numpy_s * 1e6:8.1f} us"
          f" | {numpy_s / compiled_s:.1f}x")
