//! The fusion processor.
//!
//! Per machine, a window's readings are buffered in the `window-readings`
//! map (keyed by window start) until the window is emitted:
//!
//! * `watermark` mode: each window has a timer at its end; when the task
//!   watermark reaches it, the window is emitted and its entry removed. A
//!   reading whose window already ended is late (Flink's window rule).
//! * `rollover` mode (the seed): the machine's one open window is kept in the
//!   same map; a reading of any other window emits and replaces it.

use serde::{Deserialize, Serialize};
use streams_runtime::window::tumbling_start;
use streams_runtime::{Context, InputStream, MapState, Processor, Record, Timer, Topology};

use crate::median::median;
use crate::model::{HumidityReading, MachineMaintenance, Reading, TemperatureReading};
use crate::settings::{EmitMode, Settings};

/// The non-null readings of one machine in one window.
#[derive(Debug, Default, Serialize, Deserialize)]
struct WindowReadings {
    temperatures: Vec<f64>,
    humidities: Vec<f64>,
}

/// Buffered readings per machine, by window start.
const WINDOW_READINGS: MapState<i64, WindowReadings> = MapState::new("window-readings");

/// Name of the per-window timer (one per machine and window end).
const WINDOW_END_TIMER: &str = "window-end";

/// Builds the topology: both reading topics in, verdicts out.
pub fn topology(settings: &Settings) -> anyhow::Result<Topology<Reading>> {
    Ok(Topology::new(
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
    .store(WINDOW_READINGS.name())
    .max_out_of_orderness(settings.max_out_of_orderness))
}

#[derive(Debug, Clone)]
pub struct SensorFusion {
    interval: i64,
    temperature_threshold: f64,
    humidity_threshold: f64,
    emit: EmitMode,
}

impl SensorFusion {
    pub fn new(settings: &Settings) -> Self {
        SensorFusion {
            interval: settings.window_interval.as_millis_i64().max(1),
            temperature_threshold: settings.temperature_threshold,
            humidity_threshold: settings.humidity_threshold,
            emit: settings.emit,
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
        ctx: &mut Context<'_, MachineMaintenance>,
        machine: &str,
        start: i64,
        readings: WindowReadings,
    ) -> anyhow::Result<()> {
        ctx.map_remove(&WINDOW_READINGS, machine, &start);
        let verdict = self.verdict(machine, start, readings);
        ctx.emit(Some(machine), &verdict)?;
        ctx.increment("windows_emitted");
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

    fn process(
        &mut self,
        ctx: &mut Context<'_, MachineMaintenance>,
        record: Record<'_, Reading>,
    ) -> anyhow::Result<()> {
        let machine = record.value.machine().to_string();
        let start = tumbling_start(record.event_time, self.interval);
        match self.emit {
            EmitMode::Watermark => {
                let mut readings = match ctx.map_get(&WINDOW_READINGS, &machine, &start)? {
                    Some(readings) => readings,
                    None => {
                        let timer = format!("{WINDOW_END_TIMER}-{start}");
                        ctx.set_timer(&machine, &timer, start + self.interval);
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
        ctx: &mut Context<'_, MachineMaintenance>,
        timer: Timer<'_>,
    ) -> anyhow::Result<()> {
        let start = timer.time - self.interval;
        if let Some(readings) = ctx.map_get(&WINDOW_READINGS, timer.key, &start)? {
            self.emit_window(ctx, timer.key, start, readings)?;
        }
        Ok(())
    }

    /// Watermark mode: late when the reading's window has already ended.
    /// Rollover mode (the seed) has no lateness check.
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
