//! An exactly rounded floating-point sum that can be split and merged.
//!
//! A window's price sum is computed by several tasks and combined in the
//! final stage, in an order that depends on partitioning and timing. A plain
//! `f64` sum would then differ in the last bits from run to run; this sum
//! keeps the exact value as non-overlapping partials (Shewchuk's algorithm,
//! as in Python's `math.fsum`) and rounds once, so the result is the same for
//! every order of additions.

use serde::{Deserialize, Serialize};

/// The exact sum of the `f64`s added so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExactSum {
    /// Non-overlapping partials in increasing magnitude; their exact sum is the total.
    parts: Vec<f64>,
    /// Infinities and NaNs, summed plainly (they absorb everything finite).
    non_finite: Option<f64>,
}

impl ExactSum {
    /// A sum whose exact value is that of `parts` (as [`ExactSum::parts`] gave them).
    pub fn from_parts(parts: &[f64]) -> Self {
        let mut sum = ExactSum::default();
        parts.iter().for_each(|part| sum.add(*part));
        sum
    }

    /// The partials, to be sent elsewhere and merged with [`ExactSum::from_parts`].
    pub fn parts(&self) -> Vec<f64> {
        let mut parts = self.parts.clone();
        parts.extend(self.non_finite);
        parts
    }

    /// Adds `value` exactly.
    pub fn add(&mut self, value: f64) {
        if !value.is_finite() {
            self.non_finite = Some(self.non_finite.map_or(value, |sum| sum + value));
            return;
        }
        let mut x = value;
        let mut kept = 0;
        for index in 0..self.parts.len() {
            let mut y = self.parts[index];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let high = x + y;
            let low = y - (high - x);
            if low != 0.0 {
                self.parts[kept] = low;
                kept += 1;
            }
            x = high;
        }
        self.parts.truncate(kept);
        self.parts.push(x);
    }

    /// Adds every partial of `other`.
    pub fn merge(&mut self, other: &ExactSum) {
        other.parts.iter().for_each(|part| self.add(*part));
        if let Some(value) = other.non_finite {
            self.add(value);
        }
    }

    /// The exact sum rounded to the nearest `f64` (ties to even).
    pub fn value(&self) -> f64 {
        if let Some(value) = self.non_finite {
            return value;
        }
        let Some((&top, rest)) = self.parts.split_last() else {
            return 0.0;
        };
        let mut high = top;
        let mut low = 0.0;
        let mut remaining = rest.len();
        while remaining > 0 {
            remaining -= 1;
            let x = high;
            let y = rest[remaining];
            high = x + y;
            low = y - (high - x);
            if low != 0.0 {
                break;
            }
        }
        // Round half to even when the rest would tip a tie.
        if remaining > 0 {
            let next = rest[remaining - 1];
            if (low < 0.0 && next < 0.0) || (low > 0.0 && next > 0.0) {
                let doubled = low * 2.0;
                let candidate = high + doubled;
                if doubled == candidate - high {
                    high = candidate;
                }
            }
        }
        high
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(values: &[f64]) -> f64 {
        let mut sum = ExactSum::default();
        values.iter().for_each(|v| sum.add(*v));
        sum.value()
    }

    #[test]
    fn sums_exactly_where_plain_addition_rounds() {
        assert_eq!(sum(&[0.1; 10]), 1.0);
        assert_eq!(sum(&[1e100, 1.0, -1e100]), 1.0);
        assert_eq!(sum(&[0.1, 0.2, 0.3]), 0.6);
        assert_eq!(sum(&[]), 0.0);
        // Plain addition gives 0.6000000000000001 here.
        assert_ne!(0.1 + 0.2 + 0.3, 0.6);
    }

    #[test]
    fn the_order_of_additions_and_merges_does_not_matter() {
        let values: Vec<f64> = (1..200)
            .map(|i| (i as f64) * 0.37 + 1.0 / i as f64)
            .collect();
        let forward = sum(&values);
        let mut backward: Vec<f64> = values.clone();
        backward.reverse();
        assert_eq!(sum(&backward), forward);
        let mut halves = ExactSum::default();
        values[..77].iter().for_each(|v| halves.add(*v));
        let mut other = ExactSum::default();
        values[77..].iter().for_each(|v| other.add(*v));
        halves.merge(&ExactSum::from_parts(&other.parts()));
        assert_eq!(halves.value(), forward);
    }

    #[test]
    fn non_finite_values_propagate() {
        assert_eq!(sum(&[1.0, f64::INFINITY]), f64::INFINITY);
        assert!(sum(&[f64::INFINITY, f64::NEG_INFINITY]).is_nan());
        let mut sum = ExactSum::default();
        sum.add(f64::INFINITY);
        assert_eq!(ExactSum::from_parts(&sum.parts()).value(), f64::INFINITY);
    }
}
