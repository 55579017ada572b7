"""The A/B statistic the bench scripts print, in one place: the median of paired ratios and
its 95 % bootstrap interval (4,000 resamples of the pairs with seed 1; the 2.5th and 97.5th
percentiles of the resampled medians), and the verdict it supports.

Used by ab_binaries.sh, moefy_speed.sh and tui_overhead.sh (`sys.path` gets this directory)."""
import random
import statistics


def median_ci(ratios, seed=1, resamples=4000):
    """(median, low, high) of the paired ratios `ratios`."""
    rng = random.Random(seed)
    boots = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
    return statistics.median(ratios), boots[resamples * 25 // 1000], boots[resamples * 975 // 1000 - 1]


def verdict(low, high, slower="slower", faster="faster"):
    """'no significant difference' when the interval holds 1, else which way it points."""
    if low <= 1.0 <= high:
        return "no significant difference"
    return slower if high < 1.0 else faster


if __name__ == "__main__":
    import sys
    m, lo, hi = median_ci([float(x) for x in sys.argv[1:]])
    print(f"{m:.3f} [{lo:.3f}, {hi:.3f}]")
