//! The Avro schema of every topic the services read and write, in one place.
//!
//! The `.avsc` files in `avro/` are the source of truth: services embed them
//! as reader and writer schemas, `streamctl` and the tests read them from
//! disk, and the deploy files mount them. File name = topic name.

/// Declares a constant per schema file, and the lookup table by topic.
macro_rules! schemas {
    ($($constant:ident => $topic:literal),* $(,)?) => {
        $(
            #[doc = concat!("Schema of the `", $topic, "` topic.")]
            pub const $constant: &str = include_str!(concat!("../avro/", $topic, ".avsc"));
        )*

        /// Every `(topic, schema)` pair.
        pub const ALL: &[(&str, &str)] = &[$(($topic, $constant)),*];
    };
}

schemas! {
    TEMPERATURE_READINGS => "temperature-readings",
    HUMIDITY_READINGS => "humidity-readings",
    MACHINE_MAINTENANCE => "machine-maintenance",
    ORDERS => "orders",
    SHIPMENTS => "shipments",
    SHIPPED_ORDERS => "shipped-orders",
    USER_EVENTS => "user-events",
    USER_SESSIONS => "user-sessions",
    ARTICLES => "articles",
    ARTICLE_EMBEDDINGS => "article-embeddings",
    ORDERS_MARKETPLACE => "orders-marketplace",
    ORDER_WINDOW_COUNTS => "order-window-counts",
    CLICKS => "clicks",
    UNIQUE_CLICKS => "unique-clicks",
}

/// The schema of `topic`, if it is one of the project's topics.
pub fn for_topic(topic: &str) -> Option<&'static str> {
    ALL.iter()
        .find(|(name, _)| *name == topic)
        .map(|(_, schema)| *schema)
}
