//! Flags of order-shipment-joiner (meaning and defaults:
//! docs/services/order-shipment-joiner.md).

use clap::Parser;
use streams_runtime::{HumanDuration, RuntimeArgs};

#[derive(Debug, Parser)]
#[command(name = "order-shipment-joiner", version, about)]
pub struct Settings {
    /// A shipment joins an order when order_ts <= ship_ts <= order_ts + join-window.
    #[arg(long, env = "JOIN_WINDOW", default_value = "7d")]
    pub join_window: HumanDuration,

    /// Allowed out-of-orderness of both streams (the watermark's lag).
    #[arg(long, env = "GRACE", default_value = "1d")]
    pub grace: HumanDuration,

    /// Orders topic.
    #[arg(long, env = "ORDERS_TOPIC", default_value = "orders")]
    pub orders_topic: String,

    /// Shipments topic.
    #[arg(long, env = "SHIPMENTS_TOPIC", default_value = "shipments")]
    pub shipments_topic: String,

    /// Output topic.
    #[arg(long, env = "OUTPUT_TOPIC", default_value = "shipped-orders")]
    pub output_topic: String,

    #[command(flatten)]
    pub runtime: RuntimeArgs,
}
