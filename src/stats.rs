//! Descriptive statistics shared by the UI and the reports: the one home of the median, of
//! percentiles (linear interpolation between order statistics, "type 7") and of the rule for
//! when a token count carries a rate at all.

/// Median of finite values (mean of the middle two for an even count); None when there are none.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    median_in_place(&mut v)
}

/// Median of a scratch buffer of finite values, reordering it (O(n), no allocation).
pub fn median_in_place(v: &mut [f64]) -> Option<f64> {
    let n = v.len();
    if n == 0 {
        return None;
    }
    let (lower, mid, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
    let hi = *mid;
    if n % 2 == 1 {
        return Some(hi);
    }
    let lo = lower.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((lo + hi) / 2.0)
}

/// The `q`-quantile (0 ≤ q ≤ 1) of ascending `sorted` values, interpolating linearly between the
/// two nearest order statistics; None when empty.
pub fn percentile_sorted(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let h = (n - 1) as f64 * q.clamp(0.0, 1.0);
    let (i, frac) = (h.floor() as usize, h - h.floor());
    let lo = sorted[i];
    let hi = sorted[(i + 1).min(n - 1)];
    Some(lo + (hi - lo) * frac)
}

/// The `q`-quantile of finite values in any order (see [`percentile_sorted`]).
pub fn percentile(values: impl IntoIterator<Item = f64>, q: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    percentile_sorted(&v, q)
}

/// The fewest tokens a rate (tok/s) is computed from. One token's time is a latency made of
/// fixed costs (the first token of a reply is only sampled from the prompt's logits), not a
/// throughput: `run --max-ctx 1` once printed `decode 18348.3 tok/s` from it.
pub const MIN_RATE_TOKENS: u64 = 2;

/// Tokens per second for `n` tokens in `ns`; None below [`MIN_RATE_TOKENS`] or without time.
pub fn tok_per_s(n: u64, ns: u64) -> Option<f64> {
    (n >= MIN_RATE_TOKENS && ns > 0).then(|| n as f64 * 1e9 / ns as f64)
}

/// A rate for text reports: "85.1 tok/s", or why there is none ("no rate: 1 token").
pub fn tok_per_s_text(n: u64, ns: u64) -> String {
    match tok_per_s(n, ns) {
        Some(r) => format!("{r:.1} tok/s"),
        None => format!(
            "no rate: {n} token{} (a rate needs ≥ {MIN_RATE_TOKENS})",
            if n == 1 { "" } else { "s" }
        ),
    }
}

/// A latency for text reports (e.g. the time to first token): "3.21 ms", "412.5 ms", "2.05 s".
pub fn latency_text(ns: u64) -> String {
    let ms = ns as f64 / 1e6;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.2} s", ms / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies() {
        assert_eq!(latency_text(3_210_000), "3.21 ms");
        assert_eq!(latency_text(412_490_000), "412.5 ms");
        assert_eq!(latency_text(2_049_000_000), "2.05 s");
    }

    #[test]
    fn medians() {
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([4.0, 1.0]), Some(2.5));
        assert_eq!(median([4.0, 1.0, 9.0, 2.0]), Some(3.0));
        assert_eq!(median([f64::NAN, 5.0]), Some(5.0));
        assert_eq!(median(std::iter::empty()), None);
    }

    #[test]
    fn percentiles_interpolate() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(v, 0.0), Some(1.0));
        assert_eq!(percentile(v, 0.5), Some(3.0));
        assert_eq!(percentile(v, 1.0), Some(5.0));
        assert_eq!(percentile(v, 0.9), Some(4.6));
        assert_eq!(percentile([2.0, 1.0], 0.25), Some(1.25));
        assert_eq!(percentile(std::iter::empty(), 0.5), None);
    }

    #[test]
    fn no_rate_from_zero_or_one_token() {
        assert_eq!(tok_per_s(0, 1_000), None);
        assert_eq!(tok_per_s(1, 54_500), None);
        assert_eq!(tok_per_s(2, 0), None);
        assert_eq!(tok_per_s(2, 1_000_000_000), Some(2.0));
        assert_eq!(
            tok_per_s_text(1, 54_500),
            "no rate: 1 token (a rate needs ≥ 2)"
        );
        assert_eq!(tok_per_s_text(4, 2_000_000_000), "2.0 tok/s");
    }
}
