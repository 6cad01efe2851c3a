//! Records of the input and output topics (see `shared/schemas/avro`).

use serde::{Deserialize, Serialize};

/// A `temperature-readings` value.
#[derive(Debug, Clone, Deserialize)]
pub struct TemperatureReading {
    pub machine_id: String,
    pub temperature: Option<f64>,
    pub event_time: i64,
}

/// A `humidity-readings` value.
#[derive(Debug, Clone, Deserialize)]
pub struct HumidityReading {
    pub sensor_id: String,
    pub humidity: Option<f64>,
    pub event_time: i64,
}

/// Either input; a machine_id and an equal sensor_id are one machine.
#[derive(Debug, Clone)]
pub enum Reading {
    Temperature(TemperatureReading),
    Humidity(HumidityReading),
}

impl Reading {
    /// The machine the reading belongs to.
    pub fn machine(&self) -> &str {
        match self {
            Reading::Temperature(r) => &r.machine_id,
            Reading::Humidity(r) => &r.sensor_id,
        }
    }
}

/// A `machine-maintenance` value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MachineMaintenance {
    pub machine_id: String,
    pub sensor_id: String,
    pub window_start: i64,
    pub window_end: i64,
    pub median_temperature: Option<f64>,
    pub median_humidity: Option<f64>,
    pub temperature_count: i32,
    pub humidity_count: i32,
    pub needs_maintenance: bool,
}
