"""Tables of the benchmark results: the terminal table, RESULTS.md and the hoped-for figures.

Ratios are ``median(implementation) / median(reference)``: "x morphjit" above 1 means the
implementation is that many times slower than morphjit. The floor is the faster of the two GEMM
floors (``floor.dot`` through np.dot, ``floor.njit`` inside one njit function, MLPs only).
"""
from __future__ import annotations

PEER = "peer"


def _median(r: dict, name: str):
    t = r.get("impls", {}).get(name, {}).get("time")
    return t["median_s"] if t else None


def floor_s(r: dict):
    floors = [_median(r, n) for n, e in r.get("impls", {}).items() if e.get("kind") == "floor"]
    floors = [f for f in floors if f]
    return min(floors) if floors else None


def best_peer(r: dict):
    """(name, median) of the fastest peer that ran, or (None, None)."""
    peers = [(t, n) for n, e in r.get("impls", {}).items() if e.get("kind") == PEER and (t := _median(r, n))]
    if not peers:
        return None, None
    t, n = min(peers)
    return n, t


def ratio(a, b):
    return a / b if a and b else None


def fmt_ratio(x):
    return "" if x is None else f"{x:.2f}x"


def fmt_us(s):
    if s is None:
        return ""
    us = s * 1e6
    return f"{us:.1f}" if us < 100 else f"{us:.0f}"


def fmt_s(s, digits=2):
    return "" if s is None else f"{s:.{digits}f}"


def _cell(e: dict) -> str:
    """What a table shows of one implementation: its time, or why it has none."""
    if "time" in e:
        return fmt_us(e["time"]["median_s"])
    return e.get("status", "")


def rows(r: dict) -> list:
    """One row per implementation of one workload result."""
    mj, floor = _median(r, "morphjit"), floor_s(r)
    out = []
    for name, e in r.get("impls", {}).items():
        t = e.get("time")
        med = t["median_s"] if t else None
        out.append([r["workload"], r["dtype"], name, _cell(e), fmt_us(t["iqr_s"]) if t else "",
                    str(t["samples"] * t["calls_per_sample"]) if t else "", fmt_ratio(ratio(med, mj)),
                    fmt_ratio(ratio(med, floor)), fmt_s(e.get("first_call_s")),
                    f"{e['alloc_peak_bytes'] / 1024:.0f}" if "alloc_peak_bytes" in e else "",
                    e.get("message", "")[:80]])
    return out


HEADER = ["workload", "dtype", "impl", "median us", "IQR us", "calls", "x morphjit", "x floor",
          "first call s", "alloc KiB", "note"]


def text_table(header, body) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body)] if body else [len(h) for h in header]
    fmt = lambda row: "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in body])


def md_table(header, body) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in body])


# ---------------------------------------------------------------- the hoped-for figures

def _targets(r: dict):
    """(figure, measured, target, met) of one result."""
    w, mj = r["workload"], _median(r, "morphjit")
    if mj is None:
        return
    peer, peer_t = best_peer(r)
    hoped = {"tiny": 5.0, "small": 1.5, "medium": 0.95}
    if w in hoped and peer_t:
        x = peer_t / mj
        yield f"best peer ({peer}) / morphjit", x, f">= {hoped[w]}", x >= hoped[w]
    floor = floor_s(r)
    if w == "large" and floor:
        x = mj / floor
        yield "morphjit / GEMM floor", x, "<= 1.05", x <= 1.05
    hand = _median(r, "numba.hand")
    if hand:
        x = mj / hand
        yield "morphjit / hand-written numba", x, "<= 1.15", x <= 1.15
    numpy = _median(r, "numpy")
    if w == "curve" and numpy:
        x = numpy / mj
        yield "numpy / morphjit", x, ">= 3", x >= 3


def targets_table(data: dict):
    body = [[r["workload"], r["dtype"], fig, f"{x:.2f}", target, "met" if ok else "MISSED"]
            for r in data["results"] for fig, x, target, ok in _targets(r)]
    return ["workload", "dtype", "figure", "measured", "hoped", ""], body


def workload_lines(r: dict, header=HEADER, rows_of=rows, error_chars=500) -> str:
    """One workload's rows as a table (``rows_of(r)`` under ``header``), or why it failed."""
    if "error" in r:
        return f"{r['workload']} {r['dtype']}: FAILED {r['error'][-error_chars:]}"
    return text_table(header, rows_of(r))


def terminal(data: dict, header=HEADER, rows_of=rows, summary=targets_table) -> str:
    """Every workload's rows in one table, then the ``summary(data)`` table."""
    body = [row for r in data["results"] for row in rows_of(r)]
    return text_table(header, body) + "\n\n" + text_table(*summary(data))


# ---------------------------------------------------------------- RESULTS.md

def _impl_names(data: dict) -> list:
    names = []
    for r in data["results"]:
        names += [n for n in r.get("impls", {}) if n not in names]
    return names


def _matrix(data: dict, cell) -> tuple:
    names = _impl_names(data)
    body = [[r["workload"], r["dtype"]] + [cell(r, n) for n in names] for r in data["results"]]
    return ["workload", "dtype"] + names, body


def _time_cell(r, n):
    e = r.get("impls", {}).get(n)
    if e is None:
        return ""
    if "time" not in e:
        return e.get("status", "")
    t = e["time"]
    return f"{fmt_us(t['median_s'])} ±{fmt_us(t['iqr_s'] / 2)}"


def _ratio_cell(r, n):
    return fmt_ratio(ratio(_median(r, n), _median(r, "morphjit")))


def _startup_table(data: dict):
    header = ["workload", "dtype", "morphjit cold first call s", "cold process s", "warm first call s",
              "warm process s", "from disk", "cold RSS MiB", "jax first call s", "torch.compile first call s",
              "pytensor compile+first call s", "workload process RSS MiB"]
    body = []
    for r in data["results"]:
        s = r.get("startup") or {}
        cold, warm = s.get("cold", {}), s.get("warm", {})
        first = lambda n: fmt_s(r.get("impls", {}).get(n, {}).get("first_call_s"))  # noqa: E731
        body.append([r["workload"], r["dtype"], fmt_s(cold.get("first_call_s")), fmt_s(cold.get("process_s")),
                     fmt_s(warm.get("first_call_s"), 3), fmt_s(warm.get("process_s")),
                     str(bool(warm.get("from_disk"))) if warm else "", fmt_s(cold.get("max_rss_mb"), 0),
                     first("jax"), first("torch.compile"), first("pytensor"), fmt_s(r.get("max_rss_mb"), 0)])
    return header, body


def _fresh_process_table(data: dict):
    """morphjit and each peer measured by perf.startup, one row per implementation, for the results
    whose peers' start-up was measured."""
    header = ["workload", "dtype", "impl", "cold first call s", "cold process s", "warm first call s",
              "warm process s", "warm from disk", "warm import s", "cold RSS MiB"]
    body = []
    for r in data["results"]:
        if "peer_startup" not in r:
            continue
        for name, s in [("morphjit", r.get("startup") or {})] + list(r["peer_startup"].items()):
            if "cold" not in s:
                status = s.get("status") or ("error" if "error" in s else "not run")
                body.append([r["workload"], r["dtype"], name, status] + [""] * 6)
                continue
            cold, warm = s["cold"], s["warm"]
            hit = warm.get("from_disk")  # a bool, or a count of cache hits
            hit = "" if hit is None else ("yes" if hit else "no") if isinstance(hit, bool) else str(hit)
            body.append([r["workload"], r["dtype"], name, fmt_s(cold.get("first_call_s")),
                         fmt_s(cold.get("process_s")), fmt_s(warm.get("first_call_s"), 3),
                         fmt_s(warm.get("process_s")), hit,
                         fmt_s(warm.get("import_s")), fmt_s(cold.get("max_rss_mb"), 0)])
    return header, body


def _overhead_table(data: dict):
    header = ["workload", "dtype", "morphjit call us", "entry point us", "Python-side overhead us"]
    body = []
    for r in data["results"]:
        a, b = _median(r, "morphjit"), _median(r, "morphjit.entry")
        if a and b:
            body.append([r["workload"], r["dtype"], fmt_us(a), fmt_us(b), f"{(a - b) * 1e6:.1f}"])
    return header, body


def _alloc_table(data: dict):
    names = [n for n in _impl_names(data) if any("alloc_peak_bytes" in r.get("impls", {}).get(n, {})
                                                  for r in data["results"])]
    body = [[r["workload"], r["dtype"]] + [
        f"{e['alloc_peak_bytes'] / 1024:.0f}" if "alloc_peak_bytes" in (e := r.get("impls", {}).get(n, {})) else ""
        for n in names] for r in data["results"]]
    return ["workload", "dtype"] + names, body


def _impl_entries(r: dict) -> list:
    """(name, entry) of each implementation of one result."""
    return list(r.get("impls", {}).items())


def problems(data: dict, entries=_impl_entries) -> list:
    """Markdown items for the workload processes that failed and the ``entries(result)`` (label,
    entry) that did not run."""
    out = []
    for r in data["results"]:
        if "error" in r:
            out.append(f"- {r['workload']} {r['dtype']}: the workload process failed: `{r['error'][-300:]}`")
        for label, e in entries(r):
            if e.get("status") not in (None, "ok"):
                out.append(f"- {r['workload']} {r['dtype']} {label}: **{e['status']}** {e.get('message', '')}")
    return out


def machine_lines(data: dict) -> list:
    """The Markdown items that say where the figures were measured: machine, versions, threads."""
    m, o = data["machine"], data["options"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    pools = "\n".join(f"  - {p.get('user_api')} / {p.get('internal_api', '')} {p.get('version', '') or ''}: "
                      f"{p.get('num_threads')} thread(s), kernel {p.get('architecture', 'n/a')}, "
                      f"`{p.get('prefix', '')}`" for p in m["threadpools"])
    return [
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['platform']}",
        f"- Versions: {versions}",
        f"- Threads: {o['threads']} for every implementation (OpenBLAS/OMP/MKL/NUMBA_NUM_THREADS, threadpoolctl, "
        "torch.set_num_threads, XLA_FLAGS `--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`; "
        "XLA keeps its own runtime threads, so JAX may still use more than one core). "
        f"Unset in the children: {', '.join(o['unset_env'])}.",
        "- BLAS pools in the workload processes (threadpoolctl):",
        pools,
    ]


def markdown(data: dict) -> str:
    o = data["options"]
    parts = [
        "# morphjit benchmark results",
        "",
        f"Produced by `{data['command']}` on {data['date']}.",
        "",
        *machine_lines(data),
        f"- Timing: one fresh process per workload and dtype; implementations interleaved, "
        f"{o['budget_s']} s per implementation, at least {o['min_samples']} samples, wall clock; "
        "each implementation checked against morphjit (loss and gradients allclose) before timing.",
        "",
        "## Step time, median us (± half the IQR)",
        "",
        "`morphjit.entry` is morphjit's compiled machine code called directly (no argument checks); "
        "`numba.hand` the hand-written single-function numba MLP step; `floor.dot` the step's GEMMs alone "
        "through np.dot/np.matmul into preallocated arrays; `floor.njit` the MLP's GEMMs inside one njit "
        "function.",
        "",
        md_table(*_matrix(data, _time_cell)),
        "",
        "## Ratio to morphjit (median / morphjit median; above 1 = slower than morphjit)",
        "",
        md_table(*_matrix(data, _ratio_cell)),
        "",
        "## Hoped-for figures",
        "",
        md_table(*targets_table(data)),
        "",
        "## Start-up",
        "",
        "morphjit cold = fresh process, empty MORPHJIT_CACHE_DIR (trace + codegen + numba compile); warm = "
        "fresh process loading the step from that cache. Process times are the wall time of the whole child "
        "process, interpreter start-up and data generation included. Peer first calls in this table are "
        "measured inside the workload process (their imports already done; PyTensor's includes building the "
        "graph and its own on-disk compile cache may be warm); their fresh-process figures follow.",
        "",
        md_table(*_startup_table(data)),
        "",
    ] + _fresh_process_section(data) + [
        "## Python-side call overhead",
        "",
        md_table(*_overhead_table(data)),
        "",
        "## Memory",
        "",
        "Peak bytes NumPy allocates during one steady-state step (tracemalloc; torch and JAX allocations "
        "are invisible to it and not listed). The RSS of each workload process is in the start-up table.",
        "",
        md_table(*_alloc_table(data)),
        "",
    ] + closing_sections(problems(data), HEADER, [row for r in data["results"] for row in rows(r)])
    return "\n".join(parts)


def _fresh_process_section(data: dict) -> list[str]:
    header, body = _fresh_process_table(data)
    if not body:
        return []
    return [
        "### Start-up in fresh processes, morphjit and its compiling peers",
        "",
        "Each implementation as morphjit above: a cold process with an empty persistent cache, then a warm "
        "process reusing it (JAX: `jax_compilation_cache_dir`, minimum compile time and entry size 0; "
        "torch.compile: `TORCHINDUCTOR_CACHE_DIR`, `TORCHINDUCTOR_COMPILE_THREADS` = threads; PyTensor: "
        "`base_compiledir`, graph build included in its first call). First call = the first "
        "`step(params, *data)` of the fresh process; process = its whole wall time, interpreter start-up "
        "included; import = the framework's import. Warm from disk: morphjit's disk load, JAX's "
        "compilation-cache hits, inductor's FX-graph cache hits, PyTensor's cache directory found "
        "non-empty. The peers' processes also import numba (the suite's workload module does).",
        "",
        md_table(header, body),
        "",
    ]


def closing_sections(problems: list[str], header, all_rows) -> list[str]:
    """The last sections of a results page: what was missing or wrong, then every row."""
    return ["## Missing, wrong or failed implementations", "", "\n".join(problems) or "None.", "",
            "## All rows", "", md_table(header, all_rows), ""]
