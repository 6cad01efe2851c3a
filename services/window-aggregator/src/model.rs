//! Records of the input, the output and the link between the two stages.

use serde::{Deserialize, Serialize};

use crate::settings::GroupField;

/// An `orders-marketplace` value.
#[derive(Debug, Clone, Deserialize)]
pub struct MarketplaceOrder {
    pub order_id: String,
    pub customer_id: Option<String>,
    pub product_id: String,
    pub price: f64,
    pub order_time: i64,
}

impl MarketplaceOrder {
    /// The value of `field`, the order's group.
    pub fn group(&self, field: GroupField) -> Option<&str> {
        match field {
            GroupField::Customer => self.customer_id.as_deref(),
            GroupField::Product => Some(&self.product_id),
            GroupField::Order => Some(&self.order_id),
        }
    }
}

/// An `order-window-counts` value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OrderWindowCount {
    pub window_start: i64,
    pub window_end: i64,
    pub group: Option<String>,
    pub count: i64,
    pub price_sum: f64,
    pub price_min: f64,
    pub price_max: f64,
    pub price_mean: f64,
}

/// One task's aggregate of one window (and group), sent to the final stage.
/// Schema: `window-partial.avsc`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowPartial {
    pub window_start: i64,
    pub window_end: i64,
    pub group: Option<String>,
    pub count: i64,
    pub records: i64,
    pub price_sum_parts: Vec<f64>,
    pub price_min: f64,
    pub price_max: f64,
}

/// The Avro schema of [`WindowPartial`].
pub const WINDOW_PARTIAL_SCHEMA: &str = include_str!("window-partial.avsc");
