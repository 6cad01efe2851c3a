//! Records of the input and output topics (see `shared/schemas/avro`).

use serde::{Deserialize, Serialize};

/// An `orders` value; `order_ts_raw` is in epoch seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Order {
    pub id: i32,
    pub total_amount: f64,
    pub customer_name: String,
    pub order_ts_raw: i64,
}

/// A `shipments` value; `ship_ts_raw` is in epoch seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shipment {
    pub id: String,
    pub order_id: i32,
    pub warehouse: String,
    pub ship_ts_raw: i64,
}

/// Either side of the join.
#[derive(Debug, Clone)]
pub enum JoinInput {
    Order(Order),
    Shipment(Shipment),
}

/// A `shipped-orders` value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShippedOrder {
    pub order_id: i32,
    pub order_ts: String,
    pub total: f64,
    pub customer: String,
    pub ship_id: String,
    pub ship_ts: String,
    pub warehouse: String,
    pub hr_to_ship: i64,
}
