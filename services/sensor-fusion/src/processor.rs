//! The fusion processor.
//!
//! Per machine, a window's readings are buffered in the `window-readings`
//! map (keyed by window start) until the window is emitted:
//!
//! * `watermark` mode: each window has a timer at its end; when the task
//!   watermark reaches it, the window is emitted and its entry removed. A
//!   reading whose window already ended is late (Flink's window rule).
//! * `rollover` mode: the machine's one open window is kept in the
//!   same map; a reading of any other window emits and replaces it.

use serde::{Deserialize, Serialize};
use streams_runtime::prelude::*;
use streams_runtime::window::tumbling_start;

use crate::median::median;
use crate::model::{HumidityReading, MachineMaintenance, Reading, TemperatureReading};
use crate::settings::{EmitMode, Settings};

/// The non-null readings of one machine in one window.
#[derive(Debug, Default, Serialize, Deserialize)]
struct WindowReadings {
    temperatures: Vec<f64>,
    humidities: Vec<f64>,
}

streams_runtime::stores! {
    /// Buffered readings per machine, by window start.
    WINDOW_READINGS: MapState<i64, WindowReadings> = "window-readings";
}

streams_runtime::counter_names! {
    /// What sensor-fusion counts.
    pub enum FusionCounter {
        WindowsEmitted = "windows_emitted",
    }
}

streams_runtime::timer_names! {
    /// The end of one machine's window (watermark mode). Its key is
    /// [`window_timer_key`]: one timer per machine and window.
    pub enum WindowTimer {
        End = "window-end",
    }
}

/// The timer key of `machine`'s window starting at `start`. NUL sorts
/// first, so timers due at the same time fire in machine order.
fn window_timer_key(machine: &str, start: i64) -> String {
    let mut key = String::new();
    write_window_timer_key(&mut key, machine, start);
    key
}

/// [`window_timer_key`] into `key`, whose allocation is reused.
fn write_window_timer_key(key: &mut String, machine: &str, start: i64) {
    use std::fmt::Write;
    key.clear();
    key.push_str(machine);
    key.push('\0');
    write!(key, "{start}").expect("a String takes any text");
}

/// The machine of a [`window_timer_key`].
fn machine_of_timer_key(key: &str) -> &str {
    key.rsplit_once('\0').map_or(key, |(machine, _)| machine)
}

/// The service: both reading topics in, verdicts out.
pub fn pipeline(settings: Settings) -> anyhow::Result<Pipeline> {
    let processor = SensorFusion::new(&settings);
    let topology = Topology::new(
        "sensor-fusion",
        &settings.output_topic,
        topic_schemas::MACHINE_MAINTENANCE,
    )
    .input(InputStream::new(
        &settings.temperature_topic,
        topic_schemas::TEMPERATURE_READINGS,
        |r: &TemperatureReading| r.event_time,
        Reading::Temperature,
    )?)
    .input(InputStream::new(
        &settings.humidity_topic,
        topic_schemas::HUMIDITY_READINGS,
        |r: &HumidityReading| r.event_time,
        Reading::Humidity,
    )?)
    .max_out_of_orderness(settings.max_out_of_orderness);
    Ok(Pipeline::new(settings.runtime, topology, processor))
}

#[derive(Debug, Clone)]
pub struct SensorFusion {
    interval: i64,
    temperature_threshold: f64,
    humidity_threshold: f64,
    emit: EmitMode,
    /// The timer key of the record's window, built here for every record
    /// without allocating.
    timer_key: String,
}

impl SensorFusion {
    pub fn new(settings: &Settings) -> Self {
        SensorFusion {
            interval: settings.window_interval.as_millis_i64().max(1),
            temperature_threshold: settings.temperature_threshold,
            humidity_threshold: settings.humidity_threshold,
            emit: settings.emit,
            timer_key: String::new(),
        }
    }

    fn verdict(
        &self,
        machine: &str,
        start: i64,
        mut readings: WindowReadings,
    ) -> MachineMaintenance {
        let median_temperature = median(&mut readings.temperatures);
        let median_humidity = median(&mut readings.humidities);
        let needs_maintenance = matches!(
            (median_temperature, median_humidity),
            (Some(t), Some(h)) if t > self.temperature_threshold && h > self.humidity_threshold
        );
        MachineMaintenance {
            machine_id: machine.to_string(),
            sensor_id: machine.to_string(),
            window_start: start,
            window_end: start + self.interval,
            median_temperature,
            median_humidity,
            temperature_count: readings.temperatures.len() as i32,
            humidity_count: readings.humidities.len() as i32,
            needs_maintenance,
        }
    }

    fn emit_window(
        &self,
        ctx: &mut Context<'_, Self>,
        machine: &str,
        start: i64,
        readings: WindowReadings,
    ) -> anyhow::Result<()> {
        ctx.map_remove(&WINDOW_READINGS, machine, &start);
        let verdict = self.verdict(machine, start, readings);
        ctx.emit(Some(machine), &verdict)?;
        ctx.increment(FusionCounter::WindowsEmitted);
        Ok(())
    }
}

fn add(readings: &mut WindowReadings, reading: &Reading) {
    match reading {
        Reading::Temperature(r) => readings.temperatures.extend(r.temperature),
        Reading::Humidity(r) => readings.humidities.extend(r.humidity),
    }
}

impl Processor for SensorFusion {
    type Input = Reading;
    type Output = MachineMaintenance;
    type Timers = WindowTimer;
    const STORES: &'static [StoreSpec] = STORES;

    fn process(
        &mut self,
        ctx: &mut Context<'_, Self>,
        record: Record<'_, Reading>,
    ) -> anyhow::Result<()> {
        let machine = record.value.machine().to_string();
        let start = tumbling_start(record.event_time, self.interval);
        match self.emit {
            EmitMode::Watermark => {
                // A window has readings exactly while its end timer is set
                // (see `derive_timers`): the first reading of a window, all
                // of them when windows are short, costs no state read.
                write_window_timer_key(&mut self.timer_key, &machine, start);
                let key = &self.timer_key;
                let held = if ctx.may_have_timer(key, WindowTimer::End) {
                    ctx.map_get(&WINDOW_READINGS, &machine, &start)?
                } else {
                    None
                };
                let mut readings = match held {
                    Some(readings) => readings,
                    None => {
                        ctx.set_timer(key, WindowTimer::End, start + self.interval);
                        WindowReadings::default()
                    }
                };
                add(&mut readings, &record.value);
                ctx.map_put(&WINDOW_READINGS, &machine, &start, &readings)
            }
            EmitMode::Rollover => {
                let held = ctx
                    .map_entries(&WINDOW_READINGS, &machine)?
                    .into_iter()
                    .next();
                let mut readings = match held {
                    Some((held_start, held_readings)) if held_start == start => held_readings,
                    Some((held_start, held_readings)) => {
                        self.emit_window(ctx, &machine, held_start, held_readings)?;
                        WindowReadings::default()
                    }
                    None => WindowReadings::default(),
                };
                add(&mut readings, &record.value);
                ctx.map_put(&WINDOW_READINGS, &machine, &start, &readings)
            }
        }
    }

    fn on_timer(
        &mut self,
        ctx: &mut Context<'_, Self>,
        timer: Timer<'_, WindowTimer>,
    ) -> anyhow::Result<()> {
        let WindowTimer::End = timer.name;
        let machine = machine_of_timer_key(timer.key);
        let start = timer.time - self.interval;
        if let Some(readings) = ctx.map_get(&WINDOW_READINGS, machine, &start)? {
            self.emit_window(ctx, machine, start, readings)?;
        }
        Ok(())
    }

    const DERIVE_TIMERS: Option<DeriveTimers<Self>> = Some(Self::derive_timers);

    /// Watermark mode: late when the reading's window has already ended.
    /// Rollover mode has no lateness check.
    fn is_late(&self, event_time: i64, watermark: i64) -> bool {
        match self.emit {
            EmitMode::Watermark => {
                watermark != streams_runtime::NO_WATERMARK
                    && tumbling_start(event_time, self.interval) + self.interval <= watermark
            }
            EmitMode::Rollover => false,
        }
    }
}

impl SensorFusion {
    /// Watermark mode: every buffered window has its end timer, and the
    /// timer's firing emits and removes the window, so the timers follow
    /// from the buffered windows and none is written to a changelog.
    /// Rollover mode sets no timers.
    fn derive_timers(
        &self,
        state: &StateView<'_>,
        timers: &mut DerivedTimers<'_, Self>,
    ) -> anyhow::Result<()> {
        if self.emit == EmitMode::Rollover {
            return Ok(());
        }
        state.for_each_map_key(&WINDOW_READINGS, |machine, start: i64| {
            timers.set_timer(
                &window_timer_key(machine, start),
                WindowTimer::End,
                start + self.interval,
            );
            Ok(())
        })
    }
}
