//! Rotary position embedding (RoPE) as ONNX Runtime defines it, for every family's CPU
//! reference: the pairing is the device crate's own source (`kernels-gpu/src/rotary.rs`), so a
//! kernel and its reference cannot pair elements differently.

#[allow(dead_code)]
#[path = "../../../kernels-gpu/src/rotary.rs"]
mod pairing;

pub use pairing::rotary_pair;

/// Rotates the first `rotary_dim` elements of `head` in place with one position's `cos` and
/// `sin` rows (`rotary_dim / 2` values each), in f64.
pub fn rotate_head(head: &mut [f64], cos: &[f64], sin: &[f64], rotary_dim: usize, interleaved: bool) {
    for p in 0..rotary_dim / 2 {
        let (i, j) = rotary_pair(p, rotary_dim, interleaved);
        let (a, b) = (head[i], head[j]);
        head[i] = a * cos[p] - b * sin[p];
        head[j] = b * cos[p] + a * sin[p];
    }
}

/// [`rotate_head`] with position `position`'s rows of whole `[positions, rotary_dim / 2]` cos
/// and sin caches.
pub fn rotate_at(
    head: &mut [f64],
    cos_cache: &[f64],
    sin_cache: &[f64],
    position: usize,
    rotary_dim: usize,
    interleaved: bool,
) {
    let half = rotary_dim / 2;
    let row = position * half..(position + 1) * half;
    rotate_head(head, &cos_cache[row.clone()], &sin_cache[row], rotary_dim, interleaved);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_cover_the_rotary_part_once() {
        for interleaved in [false, true] {
            for rotary_dim in [2, 16, 64, 80] {
                let mut seen = vec![0; rotary_dim];
                for p in 0..rotary_dim / 2 {
                    let (i, j) = rotary_pair(p, rotary_dim, interleaved);
                    seen[i] += 1;
                    seen[j] += 1;
                }
                assert!(seen.iter().all(|&n| n == 1), "{rotary_dim} {interleaved}");
            }
        }
    }

    #[test]
    fn rotation_keeps_the_norm_and_the_tail() {
        let mut head: Vec<f64> = (0..10).map(|i| i as f64 - 4.5).collect();
        let before = head.clone();
        let (cos, sin): (Vec<f64>, Vec<f64>) = (0..3).map(|p| ((p as f64).cos(), (p as f64).sin())).unzip();
        rotate_head(&mut head, &cos, &sin, 6, false);
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>();
        assert!((norm(&head[..6]) - norm(&before[..6])).abs() < 1e-12);
        assert_eq!(head[6..], before[6..]);
        // Pair 1 is (1, 4) with angle 1.
        assert!((head[1] - (before[1] * 1f64.cos() - before[4] * 1f64.sin())).abs() < 1e-12);
    }
}
