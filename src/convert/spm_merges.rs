//! SentencePiece merges derived from a GGUF `llama` vocabulary, in time and memory proportional
//! to the vocabulary.
//!
//! Every split of a piece into two vocabulary pieces is a merge, ranked by the merged piece's
//! score (higher first, a total order: NaN scores are refused by the caller), then by its id.
//! Naively each split hashes both halves (quadratic in the length of one long piece). Here a
//! polynomial hash (mod 2^61 − 1, random base) of every prefix and every suffix of a piece is
//! computed incrementally, so a split costs O(1) unless both halves hash to a vocabulary
//! piece, and only those candidates are verified by string lookup. A chain vocabulary (`a`,
//! `aa`, `aaa`, …) still yields merges whose total size grows with the cube of its length, so
//! the output is budgeted ([`MergeBudget`]) and refused before it outgrows it.

use std::collections::{HashMap, HashSet};

const P: u64 = (1 << 61) - 1;

fn mulmod(a: u64, b: u64) -> u64 {
    let r = (a as u128) * (b as u128);
    let lo = (r as u64) & P;
    let hi = (r >> 61) as u64;
    let s = lo + hi;
    if s >= P {
        s - P
    } else {
        s
    }
}

fn addmod(a: u64, b: u64) -> u64 {
    let s = a + b;
    if s >= P {
        s - P
    } else {
        s
    }
}

/// Hash of a whole byte string: Σ (b_i + 1) · B^i mod P.
fn hash(b: &[u8], base: u64) -> u64 {
    let (mut h, mut pw) = (0u64, 1u64);
    for &c in b {
        h = addmod(h, mulmod(c as u64 + 1, pw));
        pw = mulmod(pw, base);
    }
    h
}

/// Limits on the derived merges: their count and their bytes (both halves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergeBudget {
    pub max_merges: usize,
    pub max_bytes: usize,
}

impl MergeBudget {
    /// The budget for a vocabulary of `n` pieces totalling `bytes` bytes: 4 merges per piece
    /// plus 64 Ki, and 8 bytes of merges per vocabulary byte plus 4 MiB. Real SentencePiece
    /// vocabularies need about 2 merges per piece and 2–3 bytes per byte (Llama 2: 61,249 merges
    /// for 32,000 pieces).
    pub fn for_vocab(n: usize, bytes: usize) -> MergeBudget {
        MergeBudget {
            max_merges: n.saturating_mul(4).saturating_add(1 << 16),
            max_bytes: bytes.saturating_mul(8).saturating_add(4 << 20),
        }
    }
}

/// The merges of `tokens` as (left id, right id), best first; `Err` (a reason) when they would
/// exceed `budget`. `scores[id]` ranks the merge producing piece `id` (missing: 0).
pub fn spm_merges(
    tokens: &[&str],
    scores: &[f32],
    vocab: &HashMap<&str, u32>,
    budget: MergeBudget,
) -> Result<Vec<(u32, u32)>, String> {
    let base = 256 + fastrand::u64(..P - 512);
    let known: HashSet<u64> = tokens.iter().map(|t| hash(t.as_bytes(), base)).collect();
    let mut merges: Vec<(f32, u32, u32, u32)> = Vec::new();
    let mut bytes = 0usize;
    let (mut pre, mut suf) = (Vec::new(), Vec::new());
    for (id, piece) in tokens.iter().enumerate() {
        let b = piece.as_bytes();
        if b.len() < 2 {
            continue;
        }
        // pre[k] = hash(b[..k]), suf[k] = hash(b[k..]).
        pre.clear();
        pre.push(0u64);
        let mut pw = 1u64;
        for &c in b {
            let h = addmod(*pre.last().unwrap(), mulmod(c as u64 + 1, pw));
            pre.push(h);
            pw = mulmod(pw, base);
        }
        suf.clear();
        suf.resize(b.len() + 1, 0u64);
        for k in (0..b.len()).rev() {
            suf[k] = addmod(b[k] as u64 + 1, mulmod(base, suf[k + 1]));
        }
        for (pos, _) in piece.char_indices().skip(1) {
            if !(known.contains(&pre[pos]) && known.contains(&suf[pos])) {
                continue;
            }
            let (l, r) = piece.split_at(pos);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                bytes += b.len();
                if merges.len() >= budget.max_merges || bytes > budget.max_bytes {
                    return Err(format!(
                        "the SentencePiece merges derived from {} pieces exceed the budget of \
                         {} merges / {} bytes (a vocabulary built to blow up the import?)",
                        tokens.len(),
                        budget.max_merges,
                        budget.max_bytes
                    ));
                }
                let s = scores.get(id).copied().unwrap_or(0.0);
                merges.push((s, id as u32, li, ri));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    Ok(merges.into_iter().map(|(_, _, l, r)| (l, r)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn run(
        tokens: &[&str],
        scores: &[f32],
        budget: MergeBudget,
    ) -> Result<Vec<(u32, u32)>, String> {
        let vocab: HashMap<&str, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (*t, i as u32))
            .collect();
        spm_merges(tokens, scores, &vocab, budget)
    }

    /// The reference: every split, both halves looked up.
    fn naive(tokens: &[&str], scores: &[f32]) -> Vec<(u32, u32)> {
        let vocab: HashMap<&str, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (*t, i as u32))
            .collect();
        let mut m = Vec::new();
        for (id, p) in tokens.iter().enumerate() {
            for (pos, _) in p.char_indices().skip(1) {
                let (l, r) = p.split_at(pos);
                if let (Some(&a), Some(&b)) = (vocab.get(l), vocab.get(r)) {
                    m.push((scores[id], id as u32, a, b));
                }
            }
        }
        m.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        m.into_iter().map(|(_, _, l, r)| (l, r)).collect()
    }

    #[test]
    fn same_merges_as_every_split_lookup() {
        let tokens = [
            "<unk>", "▁", "a", "b", "ab", "▁a", "▁ab", "ba", "aba", "é", "éa", "aé", "abab",
        ];
        let scores: Vec<f32> = (0..tokens.len())
            .map(|i| -(i as f32) * 0.5 + (i % 3) as f32)
            .collect();
        let got = run(&tokens, &scores, MergeBudget::for_vocab(tokens.len(), 40)).unwrap();
        assert_eq!(got, naive(&tokens, &scores));
        assert!(!got.is_empty());
    }

    #[test]
    fn one_long_piece_is_linear() {
        let long = "x".repeat(400_000);
        let tokens = ["x", "y", long.as_str()];
        let t = Instant::now();
        let got = run(&tokens, &[0.0; 3], MergeBudget::for_vocab(3, long.len())).unwrap();
        assert!(got.is_empty());
        assert!(t.elapsed().as_secs_f64() < 2.0, "{:?}", t.elapsed());
    }

    #[test]
    fn a_chain_vocabulary_exceeds_the_budget_fast() {
        // a, aa, …, a^1500: ~1.1 M merges of up to 1.5 KB each (1.1 GB) from 1.1 MB of pieces.
        let chain: Vec<String> = (1..=1500).map(|k| "a".repeat(k)).collect();
        let tokens: Vec<&str> = chain.iter().map(String::as_str).collect();
        let bytes = tokens.iter().map(|t| t.len()).sum();
        let t = Instant::now();
        let e = run(
            &tokens,
            &vec![0.0; tokens.len()],
            MergeBudget::for_vocab(tokens.len(), bytes),
        )
        .unwrap_err();
        assert!(e.contains("budget"), "{e}");
        assert!(t.elapsed().as_secs_f64() < 2.0, "{:?}", t.elapsed());
    }
}
