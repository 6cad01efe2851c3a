//! Deterministic input for each use case, with realistic key spaces.
//!
//! Two clocks: [`Clock::Simulated`] (fill mode) gives event times from a
//! fixed epoch (2026-08-01 09:00 UTC) moving forward a little per record, so
//! a run is the same every time; [`Clock::Wall`] (rate mode) stamps every
//! record with the wall-clock time at which it is produced, which is what the
//! latency measurement relies on. In both, each input topic is in event-time
//! order: nothing is late.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::records::{
    Generated, HumidityReading, MarketplaceOrder, Order, Record, Shipment, TemperatureReading,
    UserEvent,
};
use crate::{Shape, UseCase};

/// 2026-08-01 09:00:00 UTC in epoch milliseconds (a multiple of 5 minutes).
pub const BASE_MS: i64 = 1_785_574_800_000;

/// Where event times come from.
#[derive(Debug, Clone, Copy)]
pub enum Clock {
    /// Fill mode: the generator's own clock, from [`BASE_MS`].
    Simulated,
    /// Rate mode: this wall-clock time (epoch ms) is the event time.
    Wall(i64),
}

/// A source of input records.
pub trait Generator {
    /// The next record, `None` when the requested number is reached.
    fn next(&mut self, clock: Clock) -> Option<Generated>;
}

/// Settings of a generator.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Records per input topic (fill mode); rate mode ignores it.
    pub records: u64,
    pub seed: u64,
    /// Rate mode: shape the data for a live stream (see each generator).
    pub live: bool,
    pub shape: Shape,
    /// A key space of this many keys that all stay in the service's state
    /// (`loadgen fill --keys`, `make bench-scale`; 0: the shape's own input).
    /// See [`keyed`].
    pub keys: u64,
    /// Fill mode with `keys`: the event time of the first record (epoch ms;
    /// default [`BASE_MS`]).
    pub start_ms: Option<i64>,
}

/// The generator of a use case.
pub fn generator(use_case: UseCase, spec: Spec) -> Box<dyn Generator> {
    if spec.keys > 0 {
        return keyed(use_case, spec);
    }
    match (use_case, spec.shape) {
        (UseCase::Sessionizer, Shape::Base) => Box::new(Sessions::new(spec)),
        (UseCase::Sessionizer, Shape::OutputHeavy) => Box::new(Visits::new(spec)),
        // Live: one shape, in which every order ships within 1.5 s.
        (UseCase::OrderShipmentJoiner, _) if spec.live => Box::new(LiveOrders::new(spec)),
        (UseCase::OrderShipmentJoiner, _) => Box::new(OrdersAndShipments::new(spec)),
        (UseCase::SensorFusion, _) => Box::new(Readings::new(spec)),
        // The same orders: the output-heavy shape is the service's grouping.
        (UseCase::WindowAggregator, _) => Box::new(Marketplace::new(spec)),
    }
}

/// A normally distributed number (Box-Muller).
fn normal(rng: &mut StdRng, mean: f64, deviation: f64) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random::<f64>();
    mean + deviation * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn round_to(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

// ---------------------------------------------------------------- sessionizer

/// User sessions: a pool of concurrently active users (5 000 at full size),
/// picked at random from a key space of `records / 10` users (at least
/// 1 000). A session is a `LOGIN`, then `VIEW`s, `SEARCH`es and `CART`s, 2 to
/// 20 events in all; three in four end with a `LOGOUT`, the others are
/// abandoned and time out. Event times advance 0-4 ms per event (2 ms on
/// average), so an active user is heard from every ~10 s of event time and
/// an abandoned session times out 30 s after its last event.
pub struct Sessions {
    rng: StdRng,
    left: u64,
    users: u32,
    target_active: usize,
    active: Vec<ActiveSession>,
    active_users: HashSet<u32>,
    time: i64,
}

struct ActiveSession {
    user: u32,
    left: u32,
    logout: bool,
}

impl Sessions {
    pub fn new(spec: Spec) -> Self {
        let users = if spec.live {
            100_000
        } else {
            (spec.records / 10).clamp(1_000, u32::MAX as u64) as u32
        };
        Sessions {
            rng: StdRng::seed_from_u64(spec.seed),
            left: if spec.live { u64::MAX } else { spec.records },
            users,
            target_active: (users as usize / 4).min(5_000),
            active: Vec::new(),
            active_users: HashSet::new(),
            time: BASE_MS,
        }
    }
}

impl Generator for Sessions {
    fn next(&mut self, clock: Clock) -> Option<Generated> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let time = match clock {
            Clock::Simulated => {
                self.time += self.rng.random_range(0..=4);
                self.time
            }
            Clock::Wall(now) => now,
        };
        let (user, event_type) = if self.active.len() < self.target_active {
            let user = loop {
                let candidate = self.rng.random_range(0..self.users);
                if !self.active_users.contains(&candidate) {
                    break candidate;
                }
            };
            let length = self.rng.random_range(2..=20);
            let logout = self.rng.random_bool(0.75);
            self.active.push(ActiveSession {
                user,
                left: length - 1,
                logout,
            });
            self.active_users.insert(user);
            (user, "LOGIN")
        } else {
            let index = self.rng.random_range(0..self.active.len());
            let session = &mut self.active[index];
            let user = session.user;
            let event_type = if session.left == 1 && session.logout {
                "LOGOUT"
            } else {
                activity(&mut self.rng)
            };
            session.left -= 1;
            if session.left == 0 {
                self.active.swap_remove(index);
                self.active_users.remove(&user);
            }
            (user, event_type)
        };
        Some(user_event(user, event_type, time))
    }
}

/// What a user does within a session: 60 % views, 25 % searches, 15 % carts.
fn activity(rng: &mut StdRng) -> &'static str {
    match rng.random_range(0..100) {
        0..60 => "VIEW",
        60..85 => "SEARCH",
        _ => "CART",
    }
}

fn user_event(user: u32, event_type: &str, time: i64) -> Generated {
    let user_id = format!("user-{user}");
    Generated {
        input: 0,
        key: user_id.clone(),
        record: Record::UserEvent(UserEvent {
            user_id,
            event_type: event_type.to_string(),
            event_time: time,
        }),
    }
}

/// User sessions, output-heavy: visits of one event. Every 10 ms of event
/// time, one event of a user picked at random from 200 000: with the 30 s
/// session timeout (3 000 events) a user is back within a session in ~1.5 %
/// of events, so nearly every event is a session, and a row, of its own.
/// Half the events are a `LOGOUT`, which completes its session at once (the
/// rows a latency run measures: a timeout comes 30 s later); the others are
/// activities whose sessions time out. Rate mode picks from 100 million
/// users, for the same ~1.5 % at 50 000 events/s.
pub struct Visits {
    rng: StdRng,
    left: u64,
    users: u32,
    time: i64,
}

impl Visits {
    pub fn new(spec: Spec) -> Self {
        Visits {
            rng: StdRng::seed_from_u64(spec.seed),
            left: if spec.live { u64::MAX } else { spec.records },
            users: match spec.keys {
                0 if spec.live => 100_000_000,
                0 => 200_000,
                keys => keys.min(u32::MAX as u64) as u32,
            },
            time: BASE_MS,
        }
    }
}

impl Generator for Visits {
    fn next(&mut self, clock: Clock) -> Option<Generated> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let time = match clock {
            Clock::Simulated => {
                self.time += 10;
                self.time
            }
            Clock::Wall(now) => now,
        };
        let user = self.rng.random_range(0..self.users);
        let event_type = if self.rng.random_bool(0.5) {
            "LOGOUT"
        } else {
            activity(&mut self.rng)
        };
        Some(user_event(user, event_type, time))
    }
}

// ------------------------------------------------------ order-shipment-joiner

const WAREHOUSES: &[&str] = &[
    "Boston",
    "Bar Harbor",
    "Jackson Hole",
    "Denver",
    "Reno",
    "Memphis",
    "Columbus",
    "Sacramento",
    "Allentown",
    "Tacoma",
    "Savannah",
    "El Paso",
];

fn order(rng: &mut StdRng, id: i32, seconds: i64) -> Order {
    Order {
        id,
        total_amount: rng.random_range(500..50_000) as f64 / 100.0,
        customer_name: format!("customer-{}", rng.random_range(0..50_000)),
        order_ts_raw: seconds,
    }
}

fn shipment(rng: &mut StdRng, id: String, order_id: i32, seconds: i64) -> Shipment {
    Shipment {
        id,
        order_id,
        warehouse: WAREHOUSES[rng.random_range(0..WAREHOUSES.len())].to_string(),
        ship_ts_raw: seconds,
    }
}

/// Orders and shipments, fill mode: one order record per second of event
/// time (ids 0, 1, ...; 50 000 customers), and shipments keyed by their own
/// id and written in ship-time order. Base shape: one shipment per order;
/// 97 % ship between 10 minutes and 6 days after the order (and join), 3 %
/// after more than 7 days (no row). Output-heavy: every order is written
/// twice (as a producer's retry would) and ships in two parcels, all within
/// 6 days: the join's multiset semantics make four rows of each order id's
/// four input records.
pub struct OrdersAndShipments {
    orders: std::vec::IntoIter<Order>,
    shipments: std::vec::IntoIter<Shipment>,
}

impl OrdersAndShipments {
    pub fn new(spec: Spec) -> Self {
        let (copies, parcels, unshipped_share) = match spec.shape {
            Shape::Base => (1, 1, 0.03),
            Shape::OutputHeavy => (2, 2, 0.0),
        };
        let mut rng = StdRng::seed_from_u64(spec.seed);
        let base = BASE_MS / 1000;
        let count = spec.records.min(i32::MAX as u64) as usize;
        let distinct: Vec<Order> = (0..count.div_ceil(copies) as i32)
            .map(|id| order(&mut rng, id, base + id as i64 * copies as i64))
            .collect();
        let mut shipments = Vec::with_capacity(count);
        for order in &distinct {
            for parcel in 1..=parcels {
                let delay = if rng.random_bool(unshipped_share) {
                    rng.random_range(7 * 86_400 + 1..=9 * 86_400)
                } else {
                    rng.random_range(600..=6 * 86_400)
                };
                let id = match parcel {
                    1 => format!("ship-{}", order.id),
                    _ => format!("ship-{}-{parcel}", order.id),
                };
                shipments.push(shipment(&mut rng, id, order.id, order.order_ts_raw + delay));
            }
        }
        shipments.truncate(count);
        shipments.sort_by_key(|s| (s.ship_ts_raw, s.order_id));
        let orders: Vec<Order> = distinct
            .into_iter()
            .flat_map(|order| std::iter::repeat_n(order, copies))
            .take(count)
            .collect();
        OrdersAndShipments {
            orders: orders.into_iter(),
            shipments: shipments.into_iter(),
        }
    }
}

impl Generator for OrdersAndShipments {
    fn next(&mut self, _clock: Clock) -> Option<Generated> {
        if let Some(order) = self.orders.next() {
            return Some(Generated {
                input: 0,
                key: order.id.to_string(),
                record: Record::Order(order),
            });
        }
        self.shipments.next().map(|shipment| Generated {
            input: 1,
            key: shipment.id.clone(),
            record: Record::Shipment(shipment),
        })
    }
}

/// Orders and shipments, rate mode: two steady streams of half the rate
/// each. Every other record is an order, and each order's shipment is due
/// 0.5 to 1.5 s after it; the records in between are the due shipments,
/// earliest first. Both carry the wall-clock second they are produced in, so
/// every shipment joins its order.
///
/// The in-between slots belong to shipments only: when a shipment could take
/// any slot (as it once did), a second's worth of due shipments crowded the
/// orders out, and the orders' clock (which a shipment of the same second
/// waits for; bench/results/2026-12-01-diary.md, "The joiner's latency,
/// before and after") stalled for hundreds of milliseconds every
/// few seconds. A slot with no shipment due (the first half second, and the
/// odd gap as due times fluctuate) carries an order that gets no shipment.
pub struct LiveOrders {
    rng: StdRng,
    next_id: i32,
    produced: u64,
    /// Orders whose shipment is still to come: (due time, order id).
    pending: BinaryHeap<Reverse<(i64, i32)>>,
}

impl LiveOrders {
    pub fn new(spec: Spec) -> Self {
        LiveOrders {
            rng: StdRng::seed_from_u64(spec.seed),
            // Above the ids of a keyed fill's orders, still in state.
            next_id: spec.keys.min(i32::MAX as u64) as i32,
            produced: 0,
            pending: BinaryHeap::new(),
        }
    }
}

impl Generator for LiveOrders {
    fn next(&mut self, clock: Clock) -> Option<Generated> {
        let now = match clock {
            Clock::Wall(now) => now,
            Clock::Simulated => BASE_MS + self.next_id as i64 * 1000,
        };
        let shipment_slot = self.produced % 2 == 1;
        self.produced += 1;
        if shipment_slot {
            if let Some(&Reverse((due, order_id))) = self.pending.peek() {
                if due <= now {
                    self.pending.pop();
                    let id = format!("ship-{order_id}");
                    let shipment = shipment(&mut self.rng, id, order_id, now.div_euclid(1000));
                    return Some(Generated {
                        input: 1,
                        key: shipment.id.clone(),
                        record: Record::Shipment(shipment),
                    });
                }
            }
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        let order = order(&mut self.rng, id, now.div_euclid(1000));
        if !shipment_slot {
            self.pending
                .push(Reverse((now + self.rng.random_range(500..1_500), id)));
        }
        Some(Generated {
            input: 0,
            key: id.to_string(),
            record: Record::Order(order),
        })
    }
}

// ------------------------------------------------------------- sensor-fusion

/// Every machine reports a temperature this often, and a humidity
/// [`HUMIDITY_DELAY_MS`] after it.
pub const READING_PERIOD_MS: i64 = 15_000;
const HUMIDITY_DELAY_MS: i64 = 2_000;

/// Readings: each machine reports a temperature every 15 s and a humidity 2 s
/// after it; per machine a base temperature (60-90) and humidity (60-95) plus
/// noise, 1 % of values null. Base shape: `records / 1000` machines (10 to
/// 1 000; 1 000 in rate mode), 40 readings per machine in the service's
/// 5-minute windows. Output-heavy: 10 000 machines, for the service's
/// windows of one reading period, each with one temperature and one humidity.
/// Fill mode writes all temperatures, then all humidities; rate mode
/// alternates them.
pub struct Readings {
    rng: StdRng,
    machines: u64,
    records: u64,
    index: u64,
    live: bool,
    base_temperature: Vec<f64>,
    base_humidity: Vec<f64>,
}

impl Readings {
    pub fn new(spec: Spec) -> Self {
        let mut rng = StdRng::seed_from_u64(spec.seed);
        let machines = match spec.shape {
            Shape::Base if spec.live => 1_000,
            Shape::Base => (spec.records / 1_000).clamp(10, 1_000),
            Shape::OutputHeavy => 10_000,
        };
        let base_temperature = (0..machines)
            .map(|_| rng.random_range(60.0..90.0))
            .collect();
        let base_humidity = (0..machines)
            .map(|_| rng.random_range(60.0..95.0))
            .collect();
        Readings {
            rng,
            machines,
            records: spec.records,
            index: 0,
            live: spec.live,
            base_temperature,
            base_humidity,
        }
    }
}

impl Generator for Readings {
    fn next(&mut self, clock: Clock) -> Option<Generated> {
        let (humidity, ordinal) = if self.live {
            (self.index % 2 == 1, self.index / 2)
        } else if self.index < self.records {
            (false, self.index)
        } else if self.index < 2 * self.records {
            (true, self.index - self.records)
        } else {
            return None;
        };
        self.index += 1;
        let machine = ordinal % self.machines;
        let round = (ordinal / self.machines) as i64;
        // A round's temperatures are spread so that their humidities too
        // come within the round's reading period.
        let step = (READING_PERIOD_MS - HUMIDITY_DELAY_MS - 1_000) / self.machines as i64;
        let time = match clock {
            Clock::Simulated => {
                BASE_MS
                    + round * READING_PERIOD_MS
                    + machine as i64 * step
                    + if humidity { HUMIDITY_DELAY_MS } else { 0 }
            }
            Clock::Wall(now) => now,
        };
        let id = format!("M{machine}");
        let missing = self.rng.random_bool(0.01);
        let record = if humidity {
            let value = normal(&mut self.rng, self.base_humidity[machine as usize], 4.0);
            Record::Humidity(HumidityReading {
                sensor_id: id.clone(),
                humidity: (!missing).then(|| round_to(value, 1)),
                event_time: time,
            })
        } else {
            let value = normal(&mut self.rng, self.base_temperature[machine as usize], 3.0);
            Record::Temperature(TemperatureReading {
                machine_id: id.clone(),
                temperature: (!missing).then(|| round_to(value, 1)),
                event_time: time,
            })
        };
        Some(Generated {
            input: usize::from(humidity),
            key: id,
            record,
        })
    }
}

// --------------------------------------------------------- window-aggregator

/// Marketplace orders: 500 per second of event time on average (0-4 ms
/// apart), keyed by order id; 200 000 customers (10 % of orders without
/// one), 20 000 products, log-normal prices (median ~20, rounded to cents).
/// Both shapes: the output-heavy one groups them by customer in the service
/// (nearly a group per order in every window).
pub struct Marketplace {
    rng: StdRng,
    left: u64,
    index: u64,
    time: i64,
}

impl Marketplace {
    pub fn new(spec: Spec) -> Self {
        Marketplace {
            rng: StdRng::seed_from_u64(spec.seed),
            left: if spec.live { u64::MAX } else { spec.records },
            index: 0,
            time: BASE_MS,
        }
    }
}

impl Generator for Marketplace {
    fn next(&mut self, clock: Clock) -> Option<Generated> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let time = match clock {
            Clock::Simulated => {
                self.time += self.rng.random_range(0..=4);
                self.time
            }
            Clock::Wall(now) => now,
        };
        let order_id = format!("o{}", self.index);
        self.index += 1;
        let customer_id =
            (!self.rng.random_bool(0.1)).then(|| format!("c{}", self.rng.random_range(0..200_000)));
        let price = round_to(normal(&mut self.rng, 3.0, 1.0).exp().max(0.5), 2);
        Some(Generated {
            input: 0,
            key: order_id.clone(),
            record: Record::Marketplace(MarketplaceOrder {
                order_id,
                customer_id,
                product_id: format!("p{}", self.rng.random_range(0..20_000)),
                price,
                order_time: time,
            }),
        })
    }
}

// ------------------------------------------------ keyed inputs (bench-scale)

/// Event time a keyed sessionizer fill spans: below the 30 s session
/// timeout, so no session ends.
pub const KEYED_SESSION_SPREAD_MS: i64 = 20_000;
/// Event time the orders of a keyed joiner fill span; each ships 10 minutes
/// to this much later: every order is still inside the 7-day window when
/// the input ends.
pub const KEYED_ORDER_SPREAD_S: i64 = 86_400;
/// Event time a keyed window-aggregator fill spans: inside one window of
/// an hour (`--window-size 1h --window-advance 1h`) when it starts on the
/// hour, so every group stays open.
pub const KEYED_MARKETPLACE_SPREAD_MS: i64 = 1_800_000;

/// Inputs over a key space of `spec.keys` keys that all stay in the
/// service's state to the end of the input (`make bench-scale`: the cost
/// curve as state outgrows memory). Fill mode, `records` per input topic,
/// the keys in turn (key `i % keys`), event times spread evenly from
/// `start_ms`, in order:
///
/// * sessionizer: a `LOGIN` of each user, then activities (no `LOGOUT`),
///   all within [`KEYED_SESSION_SPREAD_MS`]: `keys` open sessions;
/// * joiner: orders `0..keys` over [`KEYED_ORDER_SPREAD_S`], one shipment
///   each 10 minutes to a day later (shipments `records` too): every order
///   joins and waits in state for the rest of its 7-day window;
/// * window-aggregator: orders of customers `c0..c{keys}` (none without)
///   over [`KEYED_MARKETPLACE_SPREAD_MS`]: `keys` groups in one window.
///
/// Rate mode: the sessionizer's output-heavy visits over the `keys` users
/// (half are a `LOGOUT`: a prefilled user's ends its session), the joiner's
/// live orders with ids from `keys` on (new orders beside the prefilled
/// ones).
fn keyed(use_case: UseCase, spec: Spec) -> Box<dyn Generator> {
    match use_case {
        UseCase::Sessionizer if spec.live => Box::new(Visits::new(spec)),
        UseCase::OrderShipmentJoiner if spec.live => Box::new(LiveOrders::new(spec)),
        UseCase::Sessionizer | UseCase::WindowAggregator => {
            Box::new(KeyedRounds::new(use_case, spec))
        }
        UseCase::OrderShipmentJoiner => Box::new(KeyedOrders::new(spec)),
        UseCase::SensorFusion => panic!("sensor-fusion has no keyed input (its state is windows)"),
    }
}

/// The keyed sessionizer and window-aggregator inputs: key `i % keys` for
/// record `i`, event times spread evenly from the start.
pub struct KeyedRounds {
    use_case: UseCase,
    rng: StdRng,
    records: u64,
    keys: u64,
    index: u64,
    start: i64,
    spread: i64,
}

impl KeyedRounds {
    pub fn new(use_case: UseCase, spec: Spec) -> Self {
        assert!(!spec.live, "rate mode has no keyed {use_case:?} input");
        KeyedRounds {
            use_case,
            rng: StdRng::seed_from_u64(spec.seed),
            records: spec.records,
            keys: spec.keys,
            index: 0,
            start: spec.start_ms.unwrap_or(BASE_MS),
            spread: match use_case {
                UseCase::Sessionizer => KEYED_SESSION_SPREAD_MS,
                _ => KEYED_MARKETPLACE_SPREAD_MS,
            },
        }
    }
}

impl Generator for KeyedRounds {
    fn next(&mut self, _clock: Clock) -> Option<Generated> {
        if self.index >= self.records {
            return None;
        }
        let (i, key) = (self.index, self.index % self.keys);
        self.index += 1;
        let time = self.start + (i as i128 * self.spread as i128 / self.records as i128) as i64;
        if self.use_case == UseCase::Sessionizer {
            let event_type = if i < self.keys {
                "LOGIN"
            } else {
                activity(&mut self.rng)
            };
            return Some(user_event(key as u32, event_type, time));
        }
        let order_id = format!("o{i}");
        let price = round_to(normal(&mut self.rng, 3.0, 1.0).exp().max(0.5), 2);
        Some(Generated {
            input: 0,
            key: order_id.clone(),
            record: Record::Marketplace(MarketplaceOrder {
                order_id,
                customer_id: Some(format!("c{key}")),
                product_id: format!("p{}", self.rng.random_range(0..20_000)),
                price,
                order_time: time,
            }),
        })
    }
}

/// The keyed joiner input: all orders, then all shipments in ship-time order.
pub struct KeyedOrders {
    orders: std::vec::IntoIter<Order>,
    shipments: std::vec::IntoIter<Shipment>,
}

impl KeyedOrders {
    pub fn new(spec: Spec) -> Self {
        let mut rng = StdRng::seed_from_u64(spec.seed);
        let start = spec.start_ms.unwrap_or(BASE_MS).div_euclid(1000);
        let count = spec.records.min(i32::MAX as u64) as i64;
        let orders: Vec<Order> = (0..count)
            .map(|i| {
                let id = (i as u64 % spec.keys) as i32;
                order(&mut rng, id, start + i * KEYED_ORDER_SPREAD_S / count)
            })
            .collect();
        let mut shipments: Vec<Shipment> = orders
            .iter()
            .enumerate()
            .map(|(i, order)| {
                let delay = rng.random_range(600..=KEYED_ORDER_SPREAD_S);
                let id = format!("ship-{i}");
                shipment(&mut rng, id, order.id, order.order_ts_raw + delay)
            })
            .collect();
        shipments.sort_by_key(|s| (s.ship_ts_raw, s.order_id));
        KeyedOrders {
            orders: orders.into_iter(),
            shipments: shipments.into_iter(),
        }
    }
}

impl Generator for KeyedOrders {
    fn next(&mut self, _clock: Clock) -> Option<Generated> {
        if let Some(order) = self.orders.next() {
            return Some(Generated {
                input: 0,
                key: order.id.to_string(),
                record: Record::Order(order),
            });
        }
        self.shipments.next().map(|shipment| Generated {
            input: 1,
            key: shipment.id.clone(),
            record: Record::Shipment(shipment),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;
    use std::collections::HashMap;

    fn all(use_case: UseCase, shape: Shape, records: u64) -> Vec<Generated> {
        let mut generator = generator(
            use_case,
            Spec {
                records,
                seed: 7,
                live: false,
                shape,
                keys: 0,
                start_ms: None,
            },
        );
        std::iter::from_fn(|| generator.next(Clock::Simulated)).collect()
    }

    fn event_time(record: &Record) -> i64 {
        match record {
            Record::UserEvent(r) => r.event_time,
            Record::Temperature(r) => r.event_time,
            Record::Humidity(r) => r.event_time,
            Record::Order(r) => r.order_ts_raw * 1000,
            Record::Shipment(r) => r.ship_ts_raw * 1000,
            Record::Marketplace(r) => r.order_time,
        }
    }

    #[test]
    fn every_input_is_in_event_time_order_and_deterministic() {
        for (use_case, shape) in UseCase::value_variants()
            .iter()
            .flat_map(|u| Shape::value_variants().iter().map(move |s| (*u, *s)))
        {
            let records = all(use_case, shape, 5_000);
            assert_eq!(records, all(use_case, shape, 5_000));
            let inputs = use_case.input_schemas().len();
            assert_eq!(records.len() as u64, 5_000 * inputs as u64);
            for input in 0..inputs {
                let times: Vec<i64> = records
                    .iter()
                    .filter(|g| g.input == input)
                    .map(|g| event_time(&g.record))
                    .collect();
                assert!(
                    times.windows(2).all(|w| w[0] <= w[1]),
                    "{use_case:?} {shape:?}"
                );
            }
        }
    }

    #[test]
    fn sessions_mostly_end_with_a_logout() {
        let records = all(UseCase::Sessionizer, Shape::Base, 20_000);
        let count = |kind: &str| {
            records
                .iter()
                .filter(|g| matches!(&g.record, Record::UserEvent(e) if e.event_type == kind))
                .count()
        };
        assert!(count("LOGOUT") * 2 > count("LOGIN"));
        assert!(count("LOGOUT") < count("LOGIN"));
    }

    #[test]
    fn live_shipments_follow_their_orders_and_neither_stream_stalls() {
        let mut generator = generator(
            UseCase::OrderShipmentJoiner,
            Spec {
                records: 0,
                seed: 1,
                live: true,
                shape: Shape::Base,
                keys: 0,
                start_ms: None,
            },
        );
        // One record per millisecond: 500 orders and, after the first
        // second and a half, about 500 shipments in every second.
        let mut ordered_at = HashMap::new();
        let mut per_second = [(0, 0); 20];
        for ms in 0..20_000 {
            let second = &mut per_second[(ms / 1000) as usize];
            match generator.next(Clock::Wall(BASE_MS + ms)).unwrap().record {
                Record::Order(order) => {
                    ordered_at.insert(order.id, ms);
                    second.0 += 1;
                }
                Record::Shipment(s) => {
                    let delay = ms - ordered_at[&s.order_id];
                    assert!((500..1_600).contains(&delay), "shipped after {delay} ms");
                    second.1 += 1;
                }
                _ => unreachable!(),
            }
        }
        for (second, &(orders, shipments)) in per_second.iter().enumerate() {
            assert!(orders >= 500, "{orders} orders in second {second}");
            if second >= 2 {
                assert!(shipments >= 450, "{shipments} shipments in second {second}");
            }
        }
    }

    #[test]
    fn output_heavy_visits_are_nearly_one_session_per_event() {
        const TIMEOUT_MS: i64 = 30_000;
        let records = all(UseCase::Sessionizer, Shape::OutputHeavy, 50_000);
        // The sessionizer's rules: a session ends at a LOGOUT or when the
        // user's next event comes at least the timeout after the last one.
        let mut open: HashMap<String, i64> = HashMap::new();
        let mut sessions = 0;
        for generated in &records {
            let Record::UserEvent(event) = &generated.record else {
                unreachable!()
            };
            let continues = open
                .get(&event.user_id)
                .is_some_and(|&last| event.event_time - last < TIMEOUT_MS);
            if !continues {
                sessions += 1;
            }
            if event.event_type == "LOGOUT" {
                open.remove(&event.user_id);
            } else {
                open.insert(event.user_id.clone(), event.event_time);
            }
        }
        let per_event = sessions as f64 / records.len() as f64;
        assert!(per_event > 0.98, "{per_event} sessions per event");
    }

    #[test]
    fn output_heavy_orders_give_one_row_per_input_record() {
        const WEEK_S: i64 = 7 * 86_400;
        let records = all(UseCase::OrderShipmentJoiner, Shape::OutputHeavy, 20_000);
        let mut order_times: HashMap<i32, Vec<i64>> = HashMap::new();
        let mut rows = 0;
        for generated in &records {
            match &generated.record {
                Record::Order(order) => order_times
                    .entry(order.id)
                    .or_default()
                    .push(order.order_ts_raw),
                // Orders come first: every order copy is known here.
                Record::Shipment(s) => {
                    rows += order_times[&s.order_id]
                        .iter()
                        .filter(|&&ordered| (0..=WEEK_S).contains(&(s.ship_ts_raw - ordered)))
                        .count();
                }
                _ => unreachable!(),
            }
        }
        assert_eq!(rows, records.len());
    }

    #[test]
    fn output_heavy_readings_give_one_window_per_temperature_and_humidity() {
        let records = all(UseCase::SensorFusion, Shape::OutputHeavy, 30_000);
        // (temperatures, humidities) per machine and reading-period window.
        let mut windows: HashMap<(String, i64), (u32, u32)> = HashMap::new();
        for generated in &records {
            let window = event_time(&generated.record).div_euclid(READING_PERIOD_MS);
            let counts = windows.entry((generated.key.clone(), window)).or_default();
            match generated.input {
                0 => counts.0 += 1,
                _ => counts.1 += 1,
            }
        }
        assert!(windows.values().all(|&counts| counts == (1, 1)));
        assert_eq!(windows.len() * 2, records.len());
    }

    #[test]
    fn marketplace_orders_by_customer_are_nearly_a_group_each_per_window() {
        const SIZE_MS: i64 = 2_000;
        const ADVANCE_MS: i64 = 1_000;
        let records = all(UseCase::WindowAggregator, Shape::OutputHeavy, 50_000);
        let mut groups = HashSet::new();
        for generated in &records {
            let Record::Marketplace(order) = &generated.record else {
                unreachable!()
            };
            let last_start = order.order_time.div_euclid(ADVANCE_MS) * ADVANCE_MS;
            for start in
                (last_start - SIZE_MS + ADVANCE_MS..=last_start).step_by(ADVANCE_MS as usize)
            {
                groups.insert((start, order.customer_id.clone()));
            }
        }
        // Each order is in two windows: two rows per order at most.
        let per_order = groups.len() as f64 / records.len() as f64;
        assert!(per_order > 1.7, "{per_order} rows per order");
    }

    fn keyed_input(use_case: UseCase, records: u64, keys: u64) -> Vec<Generated> {
        let mut generator = generator(
            use_case,
            Spec {
                records,
                seed: 7,
                live: false,
                shape: Shape::Base,
                keys,
                start_ms: None,
            },
        );
        std::iter::from_fn(|| generator.next(Clock::Simulated)).collect()
    }

    #[test]
    fn keyed_inputs_keep_every_key_open_in_event_time_order() {
        for use_case in [
            UseCase::Sessionizer,
            UseCase::OrderShipmentJoiner,
            UseCase::WindowAggregator,
        ] {
            let records = keyed_input(use_case, 3_000, 1_000);
            let inputs = use_case.input_schemas().len();
            assert_eq!(records.len(), 3_000 * inputs, "{use_case:?}");
            for input in 0..inputs {
                let times: Vec<i64> = records
                    .iter()
                    .filter(|g| g.input == input)
                    .map(|g| event_time(&g.record))
                    .collect();
                assert!(times.windows(2).all(|w| w[0] <= w[1]), "{use_case:?}");
                let span = times.last().unwrap() - times[0];
                match use_case {
                    UseCase::Sessionizer => assert!(span < 30_000),
                    UseCase::WindowAggregator => assert!(span < 3_600_000),
                    _ => assert!(span <= 2 * KEYED_ORDER_SPREAD_S * 1000),
                }
            }
            let keys: HashSet<String> = records
                .iter()
                .filter_map(|g| match &g.record {
                    Record::UserEvent(e) => {
                        assert_ne!(e.event_type, "LOGOUT");
                        Some(e.user_id.clone())
                    }
                    Record::Order(o) => Some(o.id.to_string()),
                    Record::Marketplace(o) => o.customer_id.clone(),
                    _ => None,
                })
                .collect();
            assert_eq!(keys.len(), 1_000, "{use_case:?}");
        }
    }
}
