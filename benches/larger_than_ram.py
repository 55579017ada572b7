#!/usr/bin/env python3
"""The driver of benches/larger_than_ram.sh (see there): llama.cpp and cflow on the same MoE
under the same memory-cgroup limit, alternating, with bytes read from disk per token."""

import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time

T95 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365}


class Cgroup:
    """A memory cgroup (v1 `memory.limit_in_bytes` or v2 `memory.max`) that this script creates
    and removes; the limit covers the page cache the process charges."""

    def __init__(self, name, limit_bytes):
        self.limit = limit_bytes
        v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        root = "/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/memory"
        if not os.path.isdir(root):
            raise SystemExit("no memory cgroup hierarchy (neither v1 /sys/fs/cgroup/memory nor v2)")
        self.path = os.path.join(root, name)
        os.makedirs(self.path, exist_ok=True)
        knob = "memory.max" if v2 else "memory.limit_in_bytes"
        with open(os.path.join(self.path, knob), "w") as f:
            f.write(str(limit_bytes))
        self.procs = os.path.join(self.path, "cgroup.procs")

    def wrap(self, cmd):
        # The child joins the cgroup before exec, so everything it maps is charged there.
        return ["sh", "-c", f'echo $$ > "{self.procs}" && exec "$@"', "sh"] + cmd

    def remove(self):
        try:
            with open(self.procs) as f:
                left = [p for p in f.read().split() if p]
            for p in left:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for _ in range(50):
                try:
                    os.rmdir(self.path)
                    return
                except OSError:
                    time.sleep(0.1)
        except FileNotFoundError:
            pass


def drop_caches():
    """Start every run cold: without this, pages another run cached (charged to another cgroup)
    would be free hits for a limited run."""
    subprocess.run(["sync"], check=False)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def run(cmd, env=None):
    """Runs cmd, polling its /proc/PID/io read_bytes; returns (stdout, read_bytes, wall s)."""
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    last = 0
    out_chunks = []
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/io") as f:
                for line in f:
                    if line.startswith("read_bytes:"):
                        last = max(last, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.2)
    out, err = p.communicate()
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {err[-2000:]}")
    return out, last, time.time() - t0


def llama_arm(a, t, n, reps, extra):
    # Without a limit two repetitions, the second reported (the first and llama-bench's own
    # warm-up fill the page cache, as cflow's warm-up repeat does); under a limit one (the cache
    # cannot hold the model, so a second repetition is as cold as the first, and each costs
    # minutes). llama-bench's tg test feeds a random token at every step; cflow's arms do the
    # same (`--feed random`).
    return [a.llama_bench, "-m", a.gguf, "-p", "0", "-n", str(n), "-t", str(t), "-r", str(reps), "-o", "json"] + extra


def cflow_arm(a, t, n, extra):
    return [a.cflow, "bench", "decode", a.cflow_model, "--threads", str(t), "--repeat", "2", "--tokens", str(n),
            "--prompt-len", str(a.prompt), "--max-ctx", "256", "--feed", a.feed, "--json"] + extra


def parse_size(limit):
    """'none' -> None; '8G', '64M' -> bytes."""
    if limit == "none":
        return None
    unit = {"G": 2**30, "M": 2**20}[limit[-1].upper()]
    return int(float(limit[:-1]) * unit)


ARMS = [
    ("llama.cpp mmap", ("llama", [])),
    # llama.cpp's default repacks Q4_0 weights into anonymous memory; without it, every weight
    # stays in the map (what a user whose run was OOM-killed would try).
    ("llama.cpp mmap --repack 0", ("llama", ["--repack", "0"])),
    ("cflow mmap", ["--expert-tier", "mmap"]),
    # A resident copy (huge pages, experts repacked, as llama.cpp's default makes its own); the
    # expert tier then reads memory. Run only without a limit: the copy is anonymous memory.
    ("cflow resident", ["--weights", "resident"]),
    # The cache off explicitly (its default, auto, sizes one): the cache arms are separate.
    ("cflow direct sync", ["--expert-tier", "direct", "--fetch", "sync", "--expert-cache-mib", "0"]),
    ("cflow direct staged", ["--expert-tier", "direct", "--fetch", "staged", "--expert-cache-mib", "0"]),
    # --prefetch on, direct tier: the next layer's experts read speculatively, predicted by its
    # router applied one layer early (docs/SEMANTICS.md X2); the hit rate is reported.
    ("cflow direct staged+prefetch", ["--expert-tier", "direct", "--fetch", "staged", "--prefetch", "on",
                                      "--expert-cache-mib", "0"]),
]


def parse(name, out, read_bytes, tokens_total):
    if name.startswith("llama"):
        rows = json.loads(out)
        r = [x for x in rows if x.get("n_gen", 0) > 0][-1]
        samples = r.get("samples_ts") or [r["avg_ts"]]
        return {"tok_s": samples[-1], "disk_mib_per_token": read_bytes / tokens_total / 2**20,
                "disk_note": "whole process (load, the 1-token warm-up and both repetitions) / tokens generated"}
    d = json.loads(out)
    r = d["rows"][0]
    reps = r["decode_tok_s"]
    c = r.get("expert_cache")
    # cflow: the median of its two measured repeats (after its own warm-up repeat).
    return {"tok_s": reps["median"], "disk_mib_per_token": r["disk_read_mib_per_token"],
            "disk_note": "measured repeats", "expert_cache": c, "mib_per_token": r["mib_per_token"],
            "prefetch": r.get("prefetch"), "time_split": r.get("time_split")}


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--cflow-model", required=True)
    ap.add_argument("--cflow", default="target/release/cflow-tui")
    ap.add_argument("--llama-bench", default="")
    ap.add_argument("--limits", default="none 8G 4G")
    ap.add_argument("--threads", default="2 1")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tokens-limited", type=int, default=8, help="decode tokens under a limit (each costs seconds there)")
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--cache-mib", default="",
                    help="LIMIT=MiB[|MiB...],... : add direct staged+prefetch arms with the expert cache of those sizes")
    ap.add_argument("--routing", default="random routers: close to uniform, the worst case for any cache",
                    help="how the model routes (recorded in the JSON)")
    ap.add_argument("--arms", default="", help="a regular expression: run only the arms whose names match")
    ap.add_argument("--cflow-only", action="store_true", help="no llama.cpp arms (a .cflow with no GGUF twin)")
    ap.add_argument("--feed", default="random", choices=["random", "sampled"],
                    help="what cflow feeds each step: random tokens (as llama-bench) or its own greedy text (real routing)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:
        re.compile(a.arms)
    except re.error as e:
        sys.exit(f"larger_than_ram: ARMS / --arms {a.arms!r} is not a regular expression: {e}")
    cache = dict(kv.split("=") for kv in a.cache_mib.split(",") if kv)
    results = {"gguf": None if a.cflow_only else a.gguf, "cflow_model": a.cflow_model, "tokens": a.tokens,
               "tokens_limited": a.tokens_limited, "prompt": a.prompt, "feed": a.feed,
               "routing": a.routing, "runs": []}
    if os.path.exists(a.out):
        results = json.load(open(a.out))
    done = {(r["limit"], r["threads"], r["pair"], r["arm"]) for r in results["runs"]}
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.dirname(a.llama_bench) + ":" + env.get("LD_LIBRARY_PATH", "")
    cg = None

    def cleanup(*_):
        if cg:
            cg.remove()
        sys.exit(130)

    signal.signal(signal.SIGINT, cleanup)
    signal.signal(signal.SIGTERM, cleanup)
    try:
        for t in map(int, a.threads.split()):
            for limit in a.limits.split():
                arms = [x for x in ARMS if not (a.cflow_only and isinstance(x[1], tuple))
                        and (limit == "none" or x[0] != "cflow resident")
                        and (not a.arms or re.search(a.arms, x[0]))]
                for mib in cache.get(limit, "").split("|"):
                    if mib and (not a.arms or re.search(a.arms, f"cflow direct staged+prefetch cache {mib} MiB")):
                        arms.append((f"cflow direct staged+prefetch cache {mib} MiB",
                                     ["--expert-tier", "direct", "--fetch", "staged", "--prefetch", "on",
                                      "--expert-cache-mib", mib]))
                for pair in range(a.pairs):
                    order = arms if pair % 2 == 0 else arms[::-1]
                    for name, extra in order:
                        if (limit, t, pair, name) in done:
                            continue
                        if any(r.get("oom") and (r["limit"], r["threads"], r["arm"]) == (limit, t, name)
                               for r in results["runs"]):
                            continue  # OOM-killed at this limit already: it would be again
                        is_llama = isinstance(extra, tuple)
                        lim = parse_size(limit)
                        n = a.tokens if lim is None else a.tokens_limited
                        reps = 2 if lim is None else 1
                        cmd = llama_arm(a, t, n, reps, extra[1]) if is_llama else cflow_arm(a, t, n, extra)
                        cg = Cgroup(f"cflow-ltr-{os.getpid()}", lim) if lim else None
                        cold = drop_caches()
                        try:
                            out, rb, wall = run(cg.wrap(cmd) if cg else cmd, env)
                            tokens_total = (reps * n + 1) if is_llama else None
                            r = parse(name, out, rb, tokens_total or 1)
                            r.update({"limit": limit, "threads": t, "pair": pair, "arm": name, "wall_s": wall,
                                      "tokens": n, "cold_start": cold, "process_read_mib": rb / 2**20})
                        except RuntimeError as e:
                            msg = str(e)
                            oom = "exited -9" in msg
                            if oom:
                                msg = "killed by SIGKILL (the cgroup's OOM killer: the limit is below what it needs)"
                            r = {"limit": limit, "threads": t, "pair": pair, "arm": name, "error": msg[-500:], "oom": oom}
                        finally:
                            if cg:
                                cg.remove()
                                cg = None
                        results["runs"].append(r)
                        json.dump(results, open(a.out, "w"), indent=1)
                        print(f"{limit:>4} t{t} pair {pair} {name:<44} "
                              + (f"{r['tok_s']:7.2f} tok/s  disk {r['disk_mib_per_token']:8.1f} MiB/tok  {r['wall_s']:.0f} s"
                                 if "tok_s" in r else "ERROR " + r["error"][-200:]), flush=True)
    finally:
        if cg:
            cg.remove()
    summarize(results)
    json.dump(results, open(a.out, "w"), indent=1)


def summarize(results):
    runs = [r for r in results["runs"] if "tok_s" in r]
    summary = []
    keys = sorted({(r["limit"], r["threads"]) for r in runs}, key=lambda k: (k[1], k[0]))
    for limit, t in keys:
        sel = [r for r in runs if r["limit"] == limit and r["threads"] == t]
        bases = {b: {r["pair"]: r["tok_s"] for r in sel if r["arm"] == b}
                 for b in ("llama.cpp mmap", "llama.cpp mmap --repack 0")}
        for arm in sorted({r["arm"] for r in sel}):
            rs = [r for r in sel if r["arm"] == arm]
            v = [r["tok_s"] for r in rs]
            row = {"limit": limit, "threads": t, "arm": arm, "n": len(v), "tok_s_median": statistics.median(v),
                   "tok_s_min": min(v), "tok_s_max": max(v),
                   "disk_mib_per_token_median": statistics.median(r["disk_mib_per_token"] for r in rs)}
            for key, base in (("llama", bases["llama.cpp mmap"]), ("llama_repack0", bases["llama.cpp mmap --repack 0"])):
                ratios = [r["tok_s"] / base[r["pair"]] for r in rs if base.get(r["pair"], 0) > 0]
                if not ratios:
                    continue
                row[f"ratio_to_{key}_median"] = statistics.median(ratios)
                row[f"ratio_to_{key}_min_max"] = [min(ratios), max(ratios)]
                if len(ratios) > 1:
                    logs = [math.log(x) for x in ratios]
                    h = T95.get(len(logs), 1.96) * statistics.stdev(logs) / math.sqrt(len(logs))
                    row[f"ratio_to_{key}_ci95"] = [math.exp(statistics.mean(logs) - h), math.exp(statistics.mean(logs) + h)]
            caches = [r.get("expert_cache") for r in rs if r.get("expert_cache")]
            if caches:
                row["expert_cache_hit_rate_median"] = statistics.median(c["hit_rate"] or 0 for c in caches)
            pfs = [r.get("prefetch") for r in rs if r.get("prefetch") and r["prefetch"].get("hit_rate") is not None]
            if pfs:
                row["prefetch_hit_rate_median"] = statistics.median(p["hit_rate"] for p in pfs)
                row["prefetch_wasted_mib_per_token_median"] = statistics.median(p["wasted_mib_per_token"] for p in pfs)
            summary.append(row)
    results["summary"] = summary
    fails = [r for r in results["runs"] if "error" in r]
    print("| limit | threads | arm | n | tok/s median [min–max] | × llama.cpp default | × llama.cpp --repack 0 | disk MiB/token | hit rate |")
    print("|---|---|---|---|---|---|---|---|---|")
    def ratio(s, key):
        if f"ratio_to_{key}_median" not in s:
            return "—"
        out = f"{s[f'ratio_to_{key}_median']:.2f} [{s[f'ratio_to_{key}_min_max'][0]:.2f}–{s[f'ratio_to_{key}_min_max'][1]:.2f}]"
        if f"ratio_to_{key}_ci95" in s:
            out += f", CI {s[f'ratio_to_{key}_ci95'][0]:.2f}–{s[f'ratio_to_{key}_ci95'][1]:.2f}"
        return out
    for s in summary:
        print(f"| {s['limit']} | {s['threads']} | {s['arm']} | {s['n']} | {s['tok_s_median']:.2f} [{s['tok_s_min']:.2f}–{s['tok_s_max']:.2f}] | {ratio(s, 'llama')} | {ratio(s, 'llama_repack0')} | {s['disk_mib_per_token_median']:.0f} | {hits(s)} |")
    for r in fails:
        print(f"| {r['limit']} | {r['threads']} | {r['arm']} | pair {r['pair']} | failed: {r['error'][:120]} | | | | |")


def hits(s):
    out = []
    if "prefetch_hit_rate_median" in s:
        out.append(f"prefetch {100 * s['prefetch_hit_rate_median']:.0f}% ({s['prefetch_wasted_mib_per_token_median']:.0f} MiB/token wasted)")
    if "expert_cache_hit_rate_median" in s:
        out.append(f"cache {100 * s['expert_cache_hit_rate_median']:.0f}%")
    return ", ".join(out) or "—"

if __name__ == "__main__":
    main()
