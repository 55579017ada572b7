//! Descriptive statistics shared by the UI and the reports: the one home of the median and of
//! percentiles (linear interpolation between order statistics, "type 7").

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
