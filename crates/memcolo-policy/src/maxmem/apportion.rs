//! Integer apportionment for the epoch step: shares of a budget in proportion to
//! weights (largest remainders) and water-filling, exact in pages.

use super::types::PageId;
use crate::types::Pid;

/// One process's page-migration work of rule T5: pages to fill its allocation with,
/// hottest first, then (hot slow page, cold fast page) exchange pairs.
pub(super) struct Plan {
    pub(super) pid: Pid,
    pub(super) fill: Vec<PageId>,
    pub(super) pairs: Vec<(PageId, PageId)>,
}

/// Splits `total` in proportion to `weights` (finite, `>= 0`, not all 0): each share
/// rounded down, then one more to the largest remainders, ties to the lower index.
/// The shares add up to `total`.
pub(super) fn apportion(total: u64, weights: &[f64]) -> Vec<u64> {
    let sum: f64 = weights.iter().sum();
    if weights.is_empty() || sum <= 0.0 || sum.is_nan() {
        return vec![0; weights.len()];
    }
    let exact: Vec<f64> = weights.iter().map(|w| total as f64 * (w / sum)).collect();
    let mut shares: Vec<u64> = exact
        .iter()
        .map(|e| (e.floor() as u64).min(total))
        .collect();
    let mut given: u64 = shares.iter().sum();
    // Floating-point rounding may overshoot by a page or two: take from the largest.
    while given > total {
        let i = (0..shares.len())
            .max_by_key(|&i| (shares[i], std::cmp::Reverse(i)))
            .expect("non-empty");
        shares[i] -= 1;
        given -= 1;
    }
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by(|&a, &b| {
        let ra = exact[a] - shares[a] as f64;
        let rb = exact[b] - shares[b] as f64;
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().cycle().take((total - given) as usize) {
        shares[i] += 1;
    }
    shares
}

/// Splits `total <= Σ weights` in proportion to integer `weights`, exactly: each
/// share rounded down, then one more to the largest remainders (ties: lower index).
/// No share exceeds its weight.
pub(super) fn apportion_int(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&w| w as u128).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let total = (total as u128).min(sum);
    let mut shares: Vec<u64> = weights
        .iter()
        .map(|&w| (total * w as u128 / sum) as u64)
        .collect();
    let given: u128 = shares.iter().map(|&s| s as u128).sum();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by(|&a, &b| {
        let ra = total * weights[a] as u128 % sum;
        let rb = total * weights[b] as u128 % sum;
        rb.cmp(&ra).then(a.cmp(&b))
    });
    for &i in order.iter().take((total - given) as usize) {
        shares[i] += 1;
    }
    shares
}

/// Splits `budget` among demands by water-filling: every demand gets
/// `min(demand, L)` for the highest level `L` the budget allows, and the units left
/// below the next level go one each to the unsatisfied demands, lower index first.
pub(super) fn water_fill(budget: u64, demands: &[u64]) -> Vec<u64> {
    let total: u128 = demands.iter().map(|&d| d as u128).sum();
    if total <= budget as u128 {
        return demands.to_vec();
    }
    // Highest L with Σ min(d, L) <= budget (L < max demand, since the sum exceeds it).
    let fits = |l: u64| demands.iter().map(|&d| d.min(l) as u128).sum::<u128>() <= budget as u128;
    let (mut lo, mut hi) = (0u64, demands.iter().copied().max().unwrap_or(0));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let mut out: Vec<u64> = demands.iter().map(|&d| d.min(lo)).collect();
    let mut left = budget - out.iter().sum::<u64>();
    for (o, &d) in out.iter_mut().zip(demands) {
        if left == 0 {
            break;
        }
        if *o < d {
            *o += 1;
            left -= 1;
        }
    }
    out
}
