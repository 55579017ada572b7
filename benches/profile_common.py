"""What depth_profile.py and prefill_profile.py share: `perf record -e cpu-clock` at a fixed sample
period and its report by shared object and symbol; samples per category (a symbol pattern, or a
shared-object pattern for code without symbols such as libgomp's spin); CPU ms per unit of work
from a long run minus a short one; and the work itself from the GGUF geometry
(`vs_llamacpp.py bytes`, run by a Python with gguf-py)."""
import json, os, re, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PERIOD_NS = 500_000  # `perf record -c`: one sample per 0.5 ms of CPU time (cpu-clock counts ns)


def perf(cmd, env=None):
    """`perf record -e cpu-clock -c PERIOD_NS` of `cmd`, then `perf report -n` by shared object
    and symbol; returns (cmd's stdout, the report)."""
    with tempfile.NamedTemporaryFile(suffix=".data", delete=False) as f:
        data = f.name
    try:
        out = subprocess.run(["perf", "record", "-e", "cpu-clock", "-c", str(PERIOD_NS), "-o", data, "--"] + cmd,
                             capture_output=True, text=True, env=env)
        if out.returncode != 0:
            sys.exit(f"perf record failed: {' '.join(cmd)}\n{out.stderr[-2000:]}")
        rep = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "dso,symbol", "-n",
                              "--stdio"], capture_output=True, text=True).stdout
    finally:
        os.unlink(data)
    return out.stdout, rep


def categorize(report, cats):
    """Samples per category of `cats` ((name, symbol pattern, shared-object pattern or None); the
    first match wins, else "other"), and per (symbol, category), from `perf report -n` lines."""
    counts = {c: 0 for c, *_ in cats}
    counts["other"] = 0
    per_symbol = {}
    for line in report.splitlines():
        m = re.match(r"\s*[0-9.]+%\s+(\d+)\s+(\S+)\s+\[[.k]\]\s+(.*\S)", line)
        if not m:
            continue
        # The symbol, without the IPC columns (`-  -` without a PMU) that follow its padding.
        n, dso = int(m.group(1)), m.group(2)
        sym = re.sub(r"\s+(-|[0-9.]+)\s+(-|\[[^]]*\])\s*$", "", m.group(3)).strip()
        cat = next((c for c, rx, drx in cats if re.search(rx, sym) or (drx and re.search(drx, dso))), "other")
        counts[cat] += n
        key = (sym[:100].strip(), cat)
        per_symbol[key] = per_symbol.get(key, 0) + n
    return counts, per_symbol


def subtract(long_report, short_report, cats, units, top=8):
    """CPU ms per unit of work by category, (long − short) samples × the period ÷ `units` (the
    work the long run did in addition), and the `top` symbols the same way."""
    (lc, lsym), (sc, ssym) = categorize(long_report, cats), categorize(short_report, cats)
    per = PERIOD_NS / 1e6 / units
    ms = {c: round((lc[c] - sc[c]) * per, 4) for c in lc}
    best = sorted(((lsym.get(k, 0) - ssym.get(k, 0), k) for k in lsym), reverse=True)[:top]
    return ms, [{"symbol": k[0], "category": k[1], "ms": round(n * per, 4)} for n, k in best]


def geometry(gguf_path):
    """`vs_llamacpp.py bytes` of the GGUF (by `PYTHON`, default `$ANCHOR_DIR/venv/bin/python`)."""
    anchor = os.environ.get("ANCHOR_DIR", "/tmp/anchor")
    py = os.environ.get("PYTHON", os.path.join(anchor, "venv/bin/python"))
    out = subprocess.run([py, os.path.join(HERE, "vs_llamacpp.py"), "bytes", gguf_path],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{py} vs_llamacpp.py bytes {gguf_path} failed (needs gguf-py; set PYTHON):\n{out.stderr[-1000:]}")
    return json.loads(out.stdout)
