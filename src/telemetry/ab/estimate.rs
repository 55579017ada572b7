//! The estimator: a run's blocks (batch means of ln ms) and the analysis of covariance of two
//! arms' blocks (ratio and 95% interval over blocks).

use super::*;

/// One measured token: the setting it ran with (an index into the book's settings), its context
/// position and its time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub setting: u16,
    pub pos: u32,
    pub ms: f64,
}

/// One block: a batch of at least [`BLOCK`] consecutive tokens of one run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockMean {
    /// Mean context position of its tokens.
    pub pos: f64,
    /// Mean of ln(ms/token) over its tokens.
    pub ln_ms: f64,
    pub tokens: u32,
}

/// The blocks of one run of samples (consecutive positions, one setting), oldest first: the
/// first [`WARMUP`] tokens dropped, the rest cut into blocks of [`BLOCK`] tokens, a shorter tail
/// joining the last block.
pub fn run_blocks(run: &[(u32, f64)]) -> Vec<BlockMean> {
    let body: Vec<(u32, f64)> = run
        .iter()
        .skip(WARMUP)
        .filter(|(_, ms)| ms.is_finite() && *ms > 0.0)
        .copied()
        .collect();
    let nb = body.len() / BLOCK;
    (0..nb)
        .map(|k| {
            let end = if k + 1 == nb {
                body.len()
            } else {
                (k + 1) * BLOCK
            };
            let chunk = &body[k * BLOCK..end];
            let n = chunk.len() as f64;
            BlockMean {
                pos: chunk.iter().map(|x| x.0 as f64).sum::<f64>() / n,
                ln_ms: chunk.iter().map(|x| x.1.ln()).sum::<f64>() / n,
                tokens: chunk.len() as u32,
            }
        })
        .collect()
}

/// A position-corrected comparison of two arms over blocks (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Geometric-mean ms/token of each arm, corrected to `pos_ref`.
    pub ms_a: f64,
    pub ms_b: f64,
    /// ms_a / ms_b.
    pub ratio: f64,
    /// 95% confidence interval of the ratio (Student's t over blocks).
    pub ci: (f64, f64),
    /// Blocks per arm.
    pub n_a: usize,
    pub n_b: usize,
    /// Tokens in those blocks.
    pub tokens_a: usize,
    pub tokens_b: usize,
    /// Residual degrees of freedom of the fit.
    pub df: usize,
    /// Context position the arm means are corrected to (mean position of the blocks used).
    pub pos_ref: u32,
    /// Fitted common slope: relative change of ms/token per 1000 positions.
    pub slope_per_kpos: f64,
}

impl Estimate {
    /// True when the interval includes 1.0: no significant difference.
    pub fn includes_one(&self) -> bool {
        self.ci.0 <= 1.0 && 1.0 <= self.ci.1
    }

    /// Half-width of the interval relative to the ratio.
    pub fn half_width(&self) -> f64 {
        (self.ci.1 - self.ci.0) / 2.0 / self.ratio
    }
}

/// The 0.975 quantile of Student's t with `df` degrees of freedom (table to 30, then an
/// approximation good to 0.002).
pub fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df - 1],
        _ => 1.96 + 2.4 / df as f64,
    }
}

/// Compare arm `a` with arm `b`, given as blocks: ln(ms) = arm + slope·pos (common slope), the
/// ratio of the position-corrected arm means with its 95% t interval. None when an arm has
/// fewer than 2 blocks or no degree of freedom is left.
pub fn estimate(a: &[BlockMean], b: &[BlockMean]) -> Option<Estimate> {
    let ok = |v: &[BlockMean]| -> Vec<BlockMean> {
        v.iter()
            .filter(|x| x.ln_ms.is_finite() && x.pos.is_finite())
            .copied()
            .collect()
    };
    let (a, b) = (ok(a), ok(b));
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let mean = |v: &[BlockMean], f: fn(&BlockMean) -> f64| -> f64 {
        v.iter().map(f).sum::<f64>() / v.len() as f64
    };
    let (xa, ya) = (mean(&a, |x| x.pos), mean(&a, |x| x.ln_ms));
    let (xb, yb) = (mean(&b, |x| x.pos), mean(&b, |x| x.ln_ms));
    let moments = |v: &[BlockMean], mx: f64, my: f64| -> (f64, f64) {
        v.iter().fold((0.0, 0.0), |(sxy, sxx), p| {
            (
                sxy + (p.pos - mx) * (p.ln_ms - my),
                sxx + (p.pos - mx) * (p.pos - mx),
            )
        })
    };
    let (sxy_a, sxx_a) = moments(&a, xa, ya);
    let (sxy_b, sxx_b) = moments(&b, xb, yb);
    let sxx = sxx_a + sxx_b;
    let n = a.len() + b.len();
    // The slope is fitted only when the arms' blocks spread over positions.
    let fit_slope = sxx > 1e-9 && n > 3;
    let slope = if fit_slope {
        (sxy_a + sxy_b) / sxx
    } else {
        0.0
    };
    let params = if fit_slope { 3 } else { 2 };
    let df = n - params;
    if df == 0 {
        return None;
    }
    let rss = |v: &[BlockMean], mx: f64, my: f64| -> f64 {
        v.iter()
            .map(|p| {
                let r = p.ln_ms - my - slope * (p.pos - mx);
                r * r
            })
            .sum::<f64>()
    };
    let sigma2 = (rss(&a, xa, ya) + rss(&b, xb, yb)) / df as f64;
    let diff = (ya - yb) - slope * (xa - xb);
    let mut var = sigma2 * (1.0 / a.len() as f64 + 1.0 / b.len() as f64);
    if fit_slope {
        var += sigma2 * (xa - xb) * (xa - xb) / sxx;
    }
    let half = t975(df) * var.max(0.0).sqrt();
    let pos_ref = (xa * a.len() as f64 + xb * b.len() as f64) / n as f64;
    let tokens = |v: &[BlockMean]| v.iter().map(|x| x.tokens as usize).sum();
    Some(Estimate {
        ms_a: (ya + slope * (pos_ref - xa)).exp(),
        ms_b: (yb + slope * (pos_ref - xb)).exp(),
        ratio: diff.exp(),
        ci: ((diff - half).exp(), (diff + half).exp()),
        n_a: a.len(),
        n_b: b.len(),
        tokens_a: tokens(&a),
        tokens_b: tokens(&b),
        df,
        pos_ref: pos_ref.round().max(0.0) as u32,
        slope_per_kpos: (slope * 1000.0).exp() - 1.0,
    })
}

/// The most recent [`ARM_CAP`] blocks of `v` that have a block of `other` within [`CALIPER`]
/// positions, oldest first.
pub(super) fn matched(v: &[BlockMean], other: &[BlockMean]) -> Vec<BlockMean> {
    let mut out: Vec<BlockMean> = v
        .iter()
        .rev()
        .filter(|x| other.iter().any(|o| (o.pos - x.pos).abs() <= CALIPER))
        .take(ARM_CAP)
        .copied()
        .collect();
    out.reverse();
    out
}
