//! Resumed runs: a run whose steps go back (resumed from a checkpoint) holds its points in
//! the order they came, one segment after another. Drawn as it came that is a zig-zag; the
//! page draws the latest segment over the earlier ones where they overlap (a point of an
//! earlier segment at or past a later segment's first step is left out), marks each resume
//! ("resumed at step N"), and on demand draws every segment as a line of its own.

/// The indices where a segment starts after the first: each point whose step is not above
/// the one before it.
pub fn starts(steps: &[i64]) -> Vec<usize> {
    (1..steps.len())
        .filter(|&i| steps[i] <= steps[i - 1])
        .collect()
}

/// The indices of the points left when later segments supersede earlier ones over their
/// overlap, in order (their steps ascend); `None` when the steps never go back.
pub fn kept(steps: &[i64]) -> Option<Vec<usize>> {
    let starts = starts(steps);
    if starts.is_empty() {
        return None;
    }
    // Each segment's bounds, and the lowest first step of the segments after it.
    let bounds: Vec<(usize, usize)> = std::iter::once(0)
        .chain(starts.iter().copied())
        .zip(starts.iter().copied().chain(std::iter::once(steps.len())))
        .collect();
    let mut floor = vec![i64::MAX; bounds.len()];
    for k in (0..bounds.len().saturating_sub(1)).rev() {
        floor[k] = floor[k + 1].min(steps[bounds[k + 1].0]);
    }
    let mut out = Vec::with_capacity(steps.len());
    for (k, &(a, b)) in bounds.iter().enumerate() {
        out.extend((a..b).filter(|&i| steps[i] < floor[k]));
    }
    Some(out)
}

/// Each segment's index range, in order.
pub fn ranges(steps: &[i64]) -> Vec<std::ops::Range<usize>> {
    let starts = starts(steps);
    std::iter::once(0)
        .chain(starts.iter().copied())
        .zip(starts.iter().copied().chain(std::iter::once(steps.len())))
        .map(|(a, b)| a..b)
        .filter(|r| !r.is_empty())
        .collect()
}

/// `xs` picked at `idx`.
pub fn pick<T: Copy>(xs: &[T], idx: &[usize]) -> Vec<T> {
    idx.iter().map(|&i| xs[i]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resume_supersedes_the_overlap_of_what_came_before() {
        // 0..=5, resumed at 3 up to 7, resumed again at 6 up to 8.
        let steps = [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 6, 7, 8];
        assert_eq!(starts(&steps), vec![6, 11]);
        let k = kept(&steps).unwrap();
        assert_eq!(pick(&steps, &k), vec![0, 1, 2, 3, 4, 5, 6, 7, 8]);
        // Steps 3-5 from the second segment (indices 6-8), 6-8 from the third.
        assert_eq!(k, vec![0, 1, 2, 6, 7, 8, 11, 12, 13]);
        assert_eq!(ranges(&steps), vec![0..6, 6..11, 11..14]);
        assert_eq!(kept(&[1, 2, 3]), None);
        // A resume further back than an earlier one supersedes both.
        let back = [0, 5, 9, 4, 6, 2, 3];
        assert_eq!(pick(&back, &kept(&back).unwrap()), vec![0, 2, 3]);
    }
}
