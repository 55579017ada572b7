#!/usr/bin/env python3
"""Checks pipeline_native.py's two settings of the contested readings of chapter 4 against each
other: for each reading, both settings run on the same fixed-seed weights of the architecture the
reading concerns, and the script asserts that the logits DIFFER where the two readings compute
different things (max |Δlogit| > DIFFER) and are IDENTICAL (bitwise) where they must coincide
(e.g. eq. 4.11 with δd = 0, eq. 4.16 with no target past the last layer). One line per reading;
exit status 1 on the first failed expectation.

The readings (switches of `pipeline_native.Readings`; passages quoted there):
  C1  dense_index  eq. 4.11 / §4.4.2 step 1 x_out_{l-δd}  vs  x_in_{l-δd} (§4.5.1's window)
  C2  router       eq. 4.13 Norm(x_in) for every style    vs  §4.2.3's anchor per style
  C3  inject       §4.4.2 step 3 before layer l+δe runs   vs  eq. 4.16 after it (AsyncExperts)
  C8  past_end     eq. 4.16 drops l+δe >= L               vs  §5.14's clamped last-layer fetch
  C10 arch1 merge  §4.3.1's rule is implemented as written in both settings; the read-out the
                   paper does not state (s_attn or s_ffn) matters only when L is not a multiple
                   of merge_interval
  C11 arch3        eq. 4.19-4.21 as written in both settings
  C16 fp_anchor    eq. 4.22's x_block: block input (both settings)  vs  the iteration's input

The weights are the fixed-seed initialisation of pipeline_native.py (seed 200 + the model's
index in MODELS, untrained: the readings differ on any weights), the tokens 16 fixed-seed ids.

Usage: python tests/reference/literal_vs_chosen.py     (needs torch; CPU, one thread, ~10 s)
"""
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pipeline_native as pn  # noqa: E402

DIFFER = 1e-3  # min max|Δlogit| for "the readings differ" (untrained weights: Δ is O(1))
SEQ = 16


def logits(name, rd, **over):
    cfg = pn.config_of(name)
    cfg.update(over)
    seed = 200 + list(pn.MODELS).index(name)
    torch.manual_seed(seed)
    W = pn.init_weights(cfg, seed)
    tokens = torch.randint(0, cfg["vocab_size"], (SEQ,), generator=torch.Generator().manual_seed(7)).tolist()
    with torch.no_grad():
        return pn.forward(W, cfg, tokens, cfg["num_hidden_layers"], rd)[1]


def delta(name, a, b, **over):
    return (logits(name, a, **over) - logits(name, b, **over)).abs().max().item()


failures = []


def case(expect, name, a, b, what, **over):
    d = delta(name, a, b, **over)
    ok = d > DIFFER if expect == "differ" else d == 0.0
    mark = "ok" if ok else "FAIL"
    if not ok:
        failures.append(f"{name}: {what}")
    return f"{expect} on {what} ({name}{''.join(f', {k}={v}' for k, v in over.items())}): max|Δlogit| {d:.3g} {mark}"


def line(tag, title, *parts):
    print(f"{tag:4} {title:38} " + "; ".join(parts), flush=True)


def main():
    torch.set_num_threads(1)
    C, L = pn.CHOSEN, pn.LITERAL

    # The literal setting flips exactly the switches whose literal text the chosen reading departs from.
    assert (L.dense_index, L.router, L.inject, L.past_end) == ("out", "x_in", "before", "drop")
    assert (L.fp_anchor, L.arch1_readout) == (C.fp_anchor, C.arch1_readout)

    one = lambda **kw: replace(C, **kw)  # noqa: E731  chosen with one switch flipped

    line("C1", "eq. 4.11 x_out_{l-δd} vs x_in_{l-δd}",
         case("differ", "arch2_4_combined", C, one(dense_index="out"), "δd=1"),
         case("differ", "arch2_4_sync", C, one(dense_index="out"), "δd=1, δe=0"),
         case("agree", "arch4_async_experts", C, one(dense_index="out"), "δd=0"))
    line("C2", "eq. 4.13 Norm(x_in) for every style",
         case("differ", "arch2_4_combined", C, one(router="x_in"), "DelayedSum"),
         case("differ", "parallel_sqrt2", C, one(router="x_in"), "ParallelSqrt2"),
         case("differ", "arch5", C, one(router="x_in"), "FixedPoint"),
         case("agree", "arch4_async_experts", C, one(router="x_in"), "AsyncExperts (already x_in)"),
         case("agree", "arch1", C, one(router="x_in"), "two streams (no x_in)"))
    line("C3", "§4.4.2 step 3 inject before l+δe",
         case("differ", "arch4_async_experts", C, one(inject="before"), "AsyncExperts δe=2"),
         case("agree", "arch2_4_combined", C, one(inject="before"), "DelayedSum (step 4)"))
    line("C8", "eq. 4.16 drops targets >= L",
         case("differ", "arch2_4_combined", C, one(past_end="drop"), "δe=2"),
         case("differ", "arch4_async_experts", C, one(past_end="drop"), "δe=2"),
         case("agree", "arch2_4_sync", C, one(past_end="drop"), "δe=0, no target past L"))
    line("C10", "arch1 merge; read-out s_attn/s_ffn",
         case("agree", "arch1", C, L, "literal vs chosen"),
         case("agree", "arch1", C, one(arch1_readout="s_ffn"), "read-out, last layer a merge point"),
         case("differ", "arch1", C, one(arch1_readout="s_ffn"), "read-out, L % merge_interval != 0",
              num_hidden_layers=5))
    line("C11", "arch3 eq. 4.19-4.21 as written",
         case("agree", "arch3", C, L, "literal vs chosen"))
    line("C16", "eq. 4.22 x_block: block vs iteration",
         case("differ", "arch5", C, one(fp_anchor="iteration"), "3 iterations"),
         case("agree", "arch5", C, one(fp_anchor="iteration"), "1 iteration", fixed_point_iterations=1),
         case("agree", "arch5", one(router="x_in"), L, "literal vs chosen with C2 flipped"))
    line("all", "every switch at once (LITERAL)",
         *(case("differ" if name not in ("arch1", "arch3") else "agree", name, C, L, "literal vs chosen")
           for name in pn.MODELS))
    if failures:
        print(f"FAILED: {len(failures)} expectation(s): {', '.join(failures)}")
        sys.exit(1)
    print("all expectations hold")


if __name__ == "__main__":
    main()
