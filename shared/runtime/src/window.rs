//! Window arithmetic shared by windowed services. Windows are anchored to the
//! epoch and use mathematical (floor) modulo, so a time before the epoch
//! belongs to the window that really contains it.

/// Start of the tumbling window of `size` milliseconds containing `time`.
pub fn tumbling_start(time: i64, size: i64) -> i64 {
    time - time.rem_euclid(size)
}

/// Starts of every hopping window `[k*advance, k*advance + size)` containing
/// `time`, earliest first.
pub fn hopping_starts(time: i64, size: i64, advance: i64) -> impl Iterator<Item = i64> {
    let last = tumbling_start(time, advance);
    let first_k = (time - size).div_euclid(advance) + 1;
    (first_k..)
        .map(move |k| k * advance)
        .take_while(move |start| *start <= last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tumbling_windows_at_exact_boundaries() {
        assert_eq!(tumbling_start(300_000, 300_000), 300_000);
        assert_eq!(tumbling_start(299_999, 300_000), 0);
        assert_eq!(tumbling_start(0, 300_000), 0);
    }

    #[test]
    fn tumbling_windows_before_the_epoch() {
        assert_eq!(tumbling_start(-1, 300_000), -300_000);
        assert_eq!(tumbling_start(-300_000, 300_000), -300_000);
        assert_eq!(tumbling_start(-300_001, 300_000), -600_000);
    }

    #[test]
    fn hopping_windows_contain_the_time() {
        let starts: Vec<i64> = hopping_starts(1_742_290_979_010, 2_000, 1_000).collect();
        assert_eq!(starts, [1_742_290_978_000, 1_742_290_979_000]);
        let at_boundary: Vec<i64> = hopping_starts(2_000, 2_000, 1_000).collect();
        assert_eq!(at_boundary, [1_000, 2_000]);
        let negative: Vec<i64> = hopping_starts(-1, 2_000, 1_000).collect();
        assert_eq!(negative, [-2_000, -1_000]);
        let wide: Vec<i64> = hopping_starts(10, 3_000, 1_000).collect();
        assert_eq!(wide, [-2_000, -1_000, 0]);
    }
}
