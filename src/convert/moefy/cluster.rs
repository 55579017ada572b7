//! Splitting a layer's FFN units into experts: the "universal" units (active for almost every
//! token) go to the shared expert, the rest into `E` equal-size groups by balanced k-means
//! (linfa's k-means for the centroids, then a capacity-bounded assignment, nearest first) on
//! per-unit feature vectors: co-activation profiles over sampled tokens, or the gate/up rows.

use linfa::traits::Fit;
use linfa::DatasetBase;
use linfa_clustering::KMeans;
use ndarray::Array2;

/// The shared units: the `width` units active for the most tokens (`freq[i]`, ties → lower
/// index), ascending.
pub fn shared_units(freq: &[u32], width: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..freq.len()).collect();
    idx.sort_by(|&a, &b| freq[b].cmp(&freq[a]).then(a.cmp(&b)));
    idx.truncate(width);
    idx.sort_unstable();
    idx
}

/// Splits `units` (indices into `features`' rows) into `e` groups of equal size by balanced
/// k-means on the rows of `features` (one row per unit of the layer). Deterministic (linfa's
/// default seeded generator). Each group ascending; groups ordered by their smallest unit.
pub fn balanced_kmeans(
    features: &Array2<f64>,
    units: &[usize],
    e: usize,
) -> Result<Vec<Vec<usize>>, String> {
    if e == 0 || !units.len().is_multiple_of(e) {
        return Err(format!(
            "{} units do not split into {e} equal experts",
            units.len()
        ));
    }
    let cap = units.len() / e;
    let data = features.select(ndarray::Axis(0), units);
    let ds = DatasetBase::from(data.clone());
    let model = KMeans::params(e)
        .max_n_iterations(100)
        .tolerance(1e-6)
        .fit(&ds)
        .map_err(|err| format!("k-means: {err}"))?;
    let c = model.centroids();
    // Every (distance, unit, centroid), nearest first; each unit goes to the nearest centroid
    // that still has room.
    let mut pairs: Vec<(f64, usize, usize)> = Vec::with_capacity(units.len() * e);
    for (ui, row) in data.outer_iter().enumerate() {
        for (ci, cen) in c.outer_iter().enumerate() {
            let d: f64 = row
                .iter()
                .zip(cen.iter())
                .map(|(a, b)| (a - b) * (a - b))
                .sum();
            pairs.push((d, ui, ci));
        }
    }
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut owner = vec![usize::MAX; units.len()];
    let mut room = vec![cap; e];
    for (_, u, ci) in pairs {
        if owner[u] == usize::MAX && room[ci] > 0 {
            owner[u] = ci;
            room[ci] -= 1;
        }
    }
    let mut groups = vec![Vec::new(); e];
    for (ui, &ci) in owner.iter().enumerate() {
        groups[ci].push(units[ui]);
    }
    for g in &mut groups {
        g.sort_unstable();
    }
    groups.sort_by_key(|g| g[0]);
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_takes_the_most_frequent_units() {
        assert_eq!(shared_units(&[5, 9, 1, 9, 3], 2), vec![1, 3]);
        assert_eq!(shared_units(&[1, 1, 1], 0), Vec::<usize>::new());
    }

    #[test]
    fn balanced_groups_are_equal_and_separate_clear_clusters() {
        // Two tight clusters of 4 points each, interleaved in index order.
        let mut f = Array2::<f64>::zeros((8, 2));
        for i in 0..8 {
            let (x, y) = if i % 2 == 0 { (0.0, 0.0) } else { (10.0, 10.0) };
            f[[i, 0]] = x + i as f64 * 0.01;
            f[[i, 1]] = y;
        }
        let units: Vec<usize> = (0..8).collect();
        let g = balanced_kmeans(&f, &units, 2).unwrap();
        assert_eq!(g, vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
        // Deterministic.
        assert_eq!(balanced_kmeans(&f, &units, 2).unwrap(), g);
        // Capacity holds even when one cluster is bigger.
        let g = balanced_kmeans(&f, &units[..6], 3).unwrap();
        assert!(g.iter().all(|x| x.len() == 2));
        assert!(balanced_kmeans(&f, &units[..7], 2).is_err());
    }
}
