//! What is kept per window: count, and price sum, minimum and maximum.

use serde::{Deserialize, Serialize};

use crate::exact_sum::ExactSum;
use crate::model::{MarketplaceOrder, OrderWindowCount, WindowPartial};

/// The aggregate of the records of one window (and group) seen so far.
/// Partial aggregates of the same window merge into the whole.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Accumulator {
    /// Records with a customer id (`COUNT(customer_id)`).
    count: i64,
    /// All records (the divisor of the mean).
    records: i64,
    price_sum: ExactSum,
    price_min: f64,
    price_max: f64,
}

impl Default for Accumulator {
    fn default() -> Self {
        Accumulator {
            count: 0,
            records: 0,
            price_sum: ExactSum::default(),
            price_min: f64::INFINITY,
            price_max: f64::NEG_INFINITY,
        }
    }
}

impl Accumulator {
    /// Adds one order.
    pub fn add(&mut self, order: &MarketplaceOrder) {
        self.count += i64::from(order.customer_id.is_some());
        self.records += 1;
        self.price_sum.add(order.price);
        self.price_min = self.price_min.min(order.price);
        self.price_max = self.price_max.max(order.price);
    }

    /// Adds another task's partial aggregate of the same window.
    pub fn merge(&mut self, partial: &WindowPartial) {
        self.count += partial.count;
        self.records += partial.records;
        self.price_sum
            .merge(&ExactSum::from_parts(&partial.price_sum_parts));
        self.price_min = self.price_min.min(partial.price_min);
        self.price_max = self.price_max.max(partial.price_max);
    }

    /// This aggregate as a partial for the final stage.
    pub fn to_partial(
        &self,
        window_start: i64,
        window_end: i64,
        group: Option<String>,
    ) -> WindowPartial {
        WindowPartial {
            window_start,
            window_end,
            group,
            count: self.count,
            records: self.records,
            price_sum_parts: self.price_sum.parts(),
            price_min: self.price_min,
            price_max: self.price_max,
        }
    }

    /// This aggregate as the window's result.
    pub fn to_result(
        &self,
        window_start: i64,
        window_end: i64,
        group: Option<String>,
    ) -> OrderWindowCount {
        let price_sum = self.price_sum.value();
        OrderWindowCount {
            window_start,
            window_end,
            group,
            count: self.count,
            price_sum,
            price_min: self.price_min,
            price_max: self.price_max,
            price_mean: price_sum / self.records as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(customer: Option<&str>, price: f64) -> MarketplaceOrder {
        MarketplaceOrder {
            order_id: "o".into(),
            customer_id: customer.map(str::to_string),
            product_id: "p".into(),
            price,
            order_time: 0,
        }
    }

    #[test]
    fn count_skips_null_customers_but_prices_include_them() {
        let mut window = Accumulator::default();
        window.add(&order(Some("c1"), 10.0));
        window.add(&order(Some("c2"), 20.0));
        window.add(&order(None, 5.0));
        let result = window.to_result(0, 2_000, None);
        assert_eq!(result.count, 2);
        assert_eq!(result.price_sum, 35.0);
        assert_eq!(result.price_min, 5.0);
        assert_eq!(result.price_max, 20.0);
        assert_eq!(result.price_mean, 35.0 / 3.0);
    }

    #[test]
    fn merged_partials_equal_one_aggregate_of_everything() {
        let orders: Vec<MarketplaceOrder> = (0..10)
            .map(|i| order((i % 3 != 0).then_some("c"), 0.1 * i as f64))
            .collect();
        let mut whole = Accumulator::default();
        orders.iter().for_each(|o| whole.add(o));
        let mut combined = Accumulator::default();
        for chunk in orders.chunks(3) {
            let mut part = Accumulator::default();
            chunk.iter().for_each(|o| part.add(o));
            combined.merge(&part.to_partial(0, 2_000, None));
        }
        assert_eq!(
            combined.to_result(0, 2_000, None),
            whole.to_result(0, 2_000, None)
        );
    }
}
