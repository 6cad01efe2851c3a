//! The input records of the benchmarked services, field for field as in
//! `shared/schemas/avro` (the services keep their own copies private).

use serde::{Deserialize, Serialize};

/// A `user-events` value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserEvent {
    pub user_id: String,
    pub event_type: String,
    pub event_time: i64,
}

/// A `temperature-readings` value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemperatureReading {
    pub machine_id: String,
    pub temperature: Option<f64>,
    pub event_time: i64,
}

/// A `humidity-readings` value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HumidityReading {
    pub sensor_id: String,
    pub humidity: Option<f64>,
    pub event_time: i64,
}

/// An `orders` value (`order_ts_raw` in epoch seconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Order {
    pub id: i32,
    pub total_amount: f64,
    pub customer_name: String,
    pub order_ts_raw: i64,
}

/// A `shipments` value (`ship_ts_raw` in epoch seconds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shipment {
    pub id: String,
    pub order_id: i32,
    pub warehouse: String,
    pub ship_ts_raw: i64,
}

/// An `orders-marketplace` value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MarketplaceOrder {
    pub order_id: String,
    pub customer_id: Option<String>,
    pub product_id: String,
    pub price: f64,
    pub order_time: i64,
}

/// Any input record.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    UserEvent(UserEvent),
    Temperature(TemperatureReading),
    Humidity(HumidityReading),
    Order(Order),
    Shipment(Shipment),
    Marketplace(MarketplaceOrder),
}

/// One generated record: which input of the use case it goes to, its key and
/// its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    pub input: usize,
    pub key: String,
    pub record: Record,
}
