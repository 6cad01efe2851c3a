//! Human-readable durations for flags: `250ms`, `30s`, `5m`, `2h`, `7d`.
//!
//! Durations are parsed into milliseconds because event time is milliseconds
//! since the epoch everywhere in the runtime.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A non-negative span of time given on the command line, e.g. `--max-wait 30s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanDuration(Duration);

impl HumanDuration {
    /// A duration of `millis` milliseconds.
    pub const fn from_millis(millis: u64) -> Self {
        HumanDuration(Duration::from_millis(millis))
    }

    /// The duration in milliseconds, saturated to `i64` for event-time arithmetic.
    pub fn as_millis_i64(&self) -> i64 {
        i64::try_from(self.0.as_millis()).unwrap_or(i64::MAX)
    }

    /// The duration as a std [`Duration`].
    pub fn as_std(&self) -> Duration {
        self.0
    }

    /// The duration, or `None` for `0s`: for the limits that `0s` turns off
    /// (`--liveness-timeout`, `--kafka-wait-timeout`).
    pub fn unless_zero(&self) -> Option<Duration> {
        Some(self.0).filter(|duration| !duration.is_zero())
    }
}

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let split = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        // Durations are often written "30 s": a space before the unit is fine.
        let unit = unit.trim_start();
        let amount: u64 = number.parse().map_err(|_| {
            format!("invalid duration '{text}': expected a whole number followed by ms, s, m, h or d (e.g. 30s)")
        })?;
        let millis_per_unit = match unit {
            "ms" => 1,
            "s" | "" if amount == 0 => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => {
                return Err(format!(
                    "invalid duration '{text}': unknown unit '{unit}' (use ms, s, m, h or d)"
                ))
            }
        };
        amount
            .checked_mul(millis_per_unit)
            .map(HumanDuration::from_millis)
            .ok_or_else(|| format!("duration '{text}' is too large"))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0.as_millis();
        for (unit, size) in [
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1_000),
        ] {
            if millis != 0 && millis.is_multiple_of(size) {
                return write!(f, "{}{unit}", millis / size);
            }
        }
        write!(f, "{millis}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_turns_a_limit_off() {
        assert_eq!("0s".parse::<HumanDuration>().unwrap().unless_zero(), None);
        assert_eq!(
            "2m".parse::<HumanDuration>().unwrap().unless_zero(),
            Some(Duration::from_secs(120))
        );
    }

    #[test]
    fn parses_every_unit() {
        assert_eq!(
            "250ms".parse::<HumanDuration>().unwrap().as_millis_i64(),
            250
        );
        assert_eq!(
            "30s".parse::<HumanDuration>().unwrap().as_millis_i64(),
            30_000
        );
        assert_eq!(
            "5m".parse::<HumanDuration>().unwrap().as_millis_i64(),
            300_000
        );
        assert_eq!(
            "2h".parse::<HumanDuration>().unwrap().as_millis_i64(),
            7_200_000
        );
        assert_eq!(
            "7d".parse::<HumanDuration>().unwrap().as_millis_i64(),
            604_800_000
        );
        assert_eq!("0".parse::<HumanDuration>().unwrap().as_millis_i64(), 0);
        assert_eq!(
            "30 s".parse::<HumanDuration>().unwrap().as_millis_i64(),
            30_000
        );
    }

    #[test]
    fn rejects_garbage_with_a_helpful_message() {
        let err = "5 minutes".parse::<HumanDuration>().unwrap_err();
        assert!(err.contains("unknown unit"), "{err}");
        assert!("s".parse::<HumanDuration>().is_err());
        assert!("-5s".parse::<HumanDuration>().is_err());
        assert!("10".parse::<HumanDuration>().is_err());
    }

    #[test]
    fn displays_in_the_largest_exact_unit() {
        assert_eq!(HumanDuration::from_millis(604_800_000).to_string(), "7d");
        assert_eq!(HumanDuration::from_millis(90_000).to_string(), "90s");
        assert_eq!(HumanDuration::from_millis(1_500).to_string(), "1500ms");
    }
}
