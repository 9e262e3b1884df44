//! Which rows of a fixed-point pass are final: error bounds from the last logit changes and the
//! observed contraction, greedy (top-1/top-2 margin), tree and sampled certification.

/// 2ρ/(1−ρ), ρ the observed contraction clamped to [[`RHO_FLOOR`], 1/2] (1/2 without `previous`).
#[must_use]
pub fn error_factor(change: f32, previous: Option<f32>) -> f32 {
    let rho = match previous {
        Some(p) if p > 0.0 && p.is_finite() && change.is_finite() => {
            (change / p).clamp(RHO_FLOOR, 0.5)
        }
        _ => 0.5,
    };
    2.0 * rho / (1.0 - rho)
}

/// [`FixedPoint::draw_tolerance`] by default, 5·10⁻³ logits.
pub const DRAW_TOLERANCE: f32 = 5e-3;

/// Verify row `j`'s remaining-error bound: last change × [`error_factor`]; +∞ without a change.
#[must_use]
pub fn remaining_error(change: &[f32], previous: Option<&[f32]>, j: usize) -> f32 {
    let moved = change.get(j).copied().unwrap_or(f32::INFINITY);
    moved * error_factor(moved, previous.and_then(|p| p.get(j).copied()))
}

/// The smallest contraction per round trip the certification assumes.
pub const RHO_FLOOR: f32 = 0.2;

/// Greedy certification: the index of the first row whose top-1/top-2 margin is not above `margin`
/// × its error bound or whose argmax rejects `drafts[j]`, else one past the last real row.
#[must_use]
pub fn certify_greedy(
    rows: &[Vec<f32>],
    change: &[f32],
    previous: Option<&[f32]>,
    drafts: &[u32],
    margin: f32,
) -> usize {
    for (j, row) in rows.iter().enumerate() {
        let Some(arg) = certified_argmax(row, j, change, previous, margin) else {
            return j;
        };
        if drafts.get(j).is_none_or(|&d| d != arg) {
            return j + 1;
        }
    }
    rows.len()
}

/// Row `j`'s argmax if its margin is above `margin` × its remaining-error bound.
fn certified_argmax(
    row: &[f32],
    j: usize,
    change: &[f32],
    previous: Option<&[f32]>,
    margin: f32,
) -> Option<u32> {
    let (top, second, arg) = top_two(row);
    (top - second > margin * remaining_error(change, previous, j)).then_some(arg)
}

/// Greedy certification of a tree pass: how many rows along the greedy path are certified (0: not
/// even the root's); [`crate::tree::accept_tree_greedy`] then walks that path.
#[must_use]
pub fn certify_tree_greedy(
    rows: &[Vec<f32>],
    change: &[f32],
    previous: Option<&[f32]>,
    tree: &crate::tree::DraftTree,
    margin: f32,
) -> usize {
    let children = tree.children();
    let (mut row, mut certified) = (0, 0);
    while let Some(arg) = rows
        .get(row)
        .and_then(|r| certified_argmax(r, row, change, previous, margin))
    {
        certified += 1;
        match children
            .get(row)
            .and_then(|c| c.iter().find(|&&n| tree.tokens[n] == arg))
        {
            Some(&n) => row = n + 1,
            None => break,
        }
    }
    certified
}

/// Sampling certification: the leading rows (of `real`) whose error bound is at most `tolerance`.
#[must_use]
pub fn certify_sampled(
    change: &[f32],
    previous: Option<&[f32]>,
    real: usize,
    tolerance: f32,
) -> usize {
    (0..real.min(change.len()))
        .take_while(|&j| remaining_error(change, previous, j) <= tolerance)
        .count()
}

/// Largest value, second largest, and the index of the largest (first on ties).
fn top_two(row: &[f32]) -> (f32, f32, u32) {
    let (mut top, mut second, mut arg) = (f32::NEG_INFINITY, f32::NEG_INFINITY, 0u32);
    for (i, &v) in row.iter().enumerate() {
        if v > top {
            second = top;
            top = v;
            arg = i as u32;
        } else if v > second {
            second = v;
        }
    }
    (top, second, arg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_certification_stops_at_an_uncertain_row_or_a_rejection() {
        let rows = vec![
            vec![0.0, 5.0, 1.0], // argmax 1, margin 4
            vec![3.0, 0.0, 2.9], // argmax 0, margin 0.1
            vec![0.0, 0.0, 9.0],
        ];
        // No previous trip: ρ = 1/2, so row 1 (moved 0.05) fails and only row 0 is usable.
        assert_eq!(
            certify_greedy(&rows, &[0.1, 0.05, 0.1], None, &[1, 0], 1.0),
            1
        );
        // Row 1 barely moved: certified; it accepts draft 0; row 2 gives the bonus.
        assert_eq!(
            certify_greedy(&rows, &[0.1, 0.01, 0.1], None, &[1, 0], 1.0),
            3
        );
        // A fast contraction (ρ clamped to 0.2) certifies row 1 at change 0.1 …
        let prev = [1.0, 1.0, 1.0];
        assert_eq!(
            certify_greedy(&rows, &[0.1, 0.1, 0.1], Some(&prev), &[1, 0], 1.0),
            3
        );
        // … a slow one (0.1 after 0.12) does not.
        let slow = [0.12, 0.12, 0.12];
        assert_eq!(
            certify_greedy(&rows, &[0.1, 0.1, 0.1], Some(&slow), &[1, 0], 1.0),
            1
        );
        // Row 0 rejects its draft (argmax 1 ≠ 2): row 0 alone decides.
        assert_eq!(
            certify_greedy(&rows, &[0.1, 5.0, 5.0], None, &[2, 0], 1.0),
            1
        );
        // Row 0 uncertain: nothing usable.
        assert_eq!(
            certify_greedy(&rows, &[3.0, 0.0, 0.0], None, &[1, 0], 1.0),
            0
        );
        // Exact ties are never certified.
        assert_eq!(certify_greedy(&[vec![1.0, 1.0]], &[0.0], None, &[], 1.0), 0);
    }

    #[test]
    fn sampled_certification_takes_the_leading_settled_rows() {
        // No previous trip: bound = 2 × change.
        assert_eq!(certify_sampled(&[1e-5, 4e-4, 1e-2, 0.0], None, 4, 1e-3), 2);
        assert_eq!(certify_sampled(&[1e-5, 1e-5], None, 1, 1e-3), 1);
        // Fast contraction: bound = 0.5 × change.
        let prev = [1.0, 1.0];
        assert_eq!(certify_sampled(&[1.5e-3, 1.5e-3], Some(&prev), 2, 1e-3), 2);
        assert_eq!(certify_sampled(&[1.5e-3, 1.5e-3], None, 2, 1e-3), 0);
    }
}
