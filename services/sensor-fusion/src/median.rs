//! The median rule of docs/services/sensor-fusion.md: the middle value of an
//! odd count, the mean of the two middle values of an even count, none of an
//! empty list.

/// The median of `values` (reordered in place).
pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        Some(values[middle])
    } else {
        Some((values[middle - 1] + values[middle]) / 2.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_count_takes_the_middle_value() {
        assert_eq!(median(&mut [82.0, 76.0, 80.0]), Some(80.0));
    }

    #[test]
    fn even_count_takes_the_mean_of_the_two_middle_values() {
        assert_eq!(median(&mut [78.0, 80.0, 76.0, 82.0]), Some(79.0));
        assert_eq!(median(&mut [85.0, 88.0, 82.0, 90.0]), Some(86.5));
    }

    #[test]
    fn empty_has_no_median() {
        assert_eq!(median(&mut []), None);
    }
}
