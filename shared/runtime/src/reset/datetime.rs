//! The hand-written date, time and duration parsing of `reset`'s
//! `--to-datetime` and `--by-duration`, and the ISO 8601 rendering of a
//! time in its output: on their own here, so that they can be replaced
//! as a whole.

use crate::duration::HumanDuration;

/// Milliseconds since the epoch from `YYYY-MM-DDTHH:MM:SS[.fff]` with an
/// optional `Z` or `±HH:MM` (UTC without one).
pub(super) fn parse_datetime(text: &str) -> Result<i64, String> {
    let invalid = || {
        format!(
            "invalid date and time '{text}': expected YYYY-MM-DDTHH:MM:SS, optionally with \
             .fff and Z or an offset such as +01:00 (UTC without one)"
        )
    };
    let (date, rest) = text.split_once(['T', ' ']).ok_or_else(invalid)?;
    let (time, zone_offset_minutes) = match rest.find(['Z', 'z', '+', '-']) {
        None => (rest, 0),
        Some(at) => (&rest[..at], parse_zone(&rest[at..]).ok_or_else(invalid)?),
    };
    let numbers = |part: &str, separator: char| -> Option<Vec<i64>> {
        part.split(separator).map(|n| n.parse().ok()).collect()
    };
    let [year, month, day] = numbers(date, '-').ok_or_else(invalid)?[..] else {
        return Err(invalid());
    };
    let (time, fraction) = time.split_once('.').unwrap_or((time, ""));
    let [hour, minute, second] = numbers(time, ':').ok_or_else(invalid)?[..] else {
        return Err(invalid());
    };
    let in_range = (1..=12).contains(&month)
        && (1..=days_in_month(year, month)).contains(&day)
        && (0..24).contains(&hour)
        && (0..60).contains(&minute)
        && (0..60).contains(&second)
        && fraction.chars().all(|c| c.is_ascii_digit());
    if !in_range {
        return Err(invalid());
    }
    let millis: i64 = format!("{fraction:0<3}")[..3].parse().unwrap_or(0);
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second
        - zone_offset_minutes * 60;
    Ok(seconds * 1_000 + millis)
}

/// `Z`, or `±HH:MM` / `±HHMM` / `±HH`, in minutes east of UTC.
fn parse_zone(zone: &str) -> Option<i64> {
    if zone.eq_ignore_ascii_case("z") {
        return Some(0);
    }
    let sign = if zone.starts_with('-') { -1 } else { 1 };
    let digits: String = zone[1..].chars().filter(|c| *c != ':').collect();
    if digits.len() != 2 && digits.len() != 4 || !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let hours: i64 = digits[..2].parse().ok()?;
    let minutes: i64 = digits
        .get(2..)
        .filter(|m| !m.is_empty())
        .map_or(Some(0), |m| m.parse().ok())?;
    (hours < 24 && minutes < 60).then_some(sign * (hours * 60 + minutes))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// `YYYY-MM-DDTHH:MM:SS.fffZ` of milliseconds since the epoch (Howard
/// Hinnant's `civil_from_days`).
pub(super) fn iso_utc(millis: i64) -> String {
    let days = millis.div_euclid(86_400_000);
    let in_day = millis.rem_euclid(86_400_000);
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1_000 % 60,
        in_day % 1_000
    )
}

/// A duration back from now: ISO 8601 (`PT1H`, `P2DT3H4M5.5S`, as
/// Kafka's reset tool takes) or the runtime's own (`1h`, `90m`).
pub(super) fn parse_lookback(text: &str) -> Result<HumanDuration, String> {
    match text.strip_prefix(['P', 'p']) {
        Some(iso) => parse_iso_duration(iso).ok_or_else(|| {
            format!(
                "invalid duration '{text}': expected ISO 8601 PnDTnHnMn.nS (e.g. PT1H) or a \
                 whole number followed by ms, s, m, h or d (e.g. 1h)"
            )
        }),
        None => text.parse(),
    }
}

/// The part of an ISO 8601 duration after `P`: `nD`, then `T` with `nH`,
/// `nM`, `n.nS`, each at most once and in that order.
fn parse_iso_duration(text: &str) -> Option<HumanDuration> {
    let (days, time) = match text.split_once(['T', 't']) {
        Some((days, time)) if !time.is_empty() => (days, Some(time)),
        Some(_) => return None,
        None => (text, None),
    };
    let mut millis: u64 = 0;
    let mut add = |part: &str, units: &[(char, u64)]| -> Option<()> {
        let mut rest = part;
        let mut allowed = units;
        while !rest.is_empty() {
            let end = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
            let (number, tail) = rest.split_at(end);
            let unit = tail.chars().next()?.to_ascii_uppercase();
            let position = allowed.iter().position(|(name, _)| *name == unit)?;
            let size = allowed[position].1;
            allowed = &allowed[position + 1..];
            let amount = match number.split_once('.') {
                Some((whole, fraction)) if unit == 'S' && !fraction.is_empty() => {
                    let fraction = format!("{fraction:0<3}");
                    whole.parse::<u64>().ok()?.checked_mul(1_000)?
                        + fraction.get(..3)?.parse::<u64>().ok()?
                }
                Some(_) => return None,
                None => number.parse::<u64>().ok()?.checked_mul(size)?,
            };
            millis = millis.checked_add(amount)?;
            rest = &tail[1..];
        }
        Some(())
    };
    if days.is_empty() && time.is_none() {
        return None;
    }
    add(days, &[('D', 86_400_000)])?;
    if let Some(time) = time {
        add(time, &[('H', 3_600_000), ('M', 60_000), ('S', 1_000)])?;
    }
    Some(HumanDuration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z

    #[test]
    fn date_times_are_utc_unless_they_carry_an_offset() {
        assert_eq!(parse_datetime("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_datetime("2026-12-01T00:00:00"), Ok(NOW));
        assert_eq!(parse_datetime("2026-12-01T00:00:00.5Z"), Ok(NOW + 500));
        assert_eq!(parse_datetime("2026-12-01T00:00:00.123456Z"), Ok(NOW + 123));
        assert_eq!(
            parse_datetime("2026-12-01T01:30:00+01:30"),
            Ok(NOW),
            "an hour and a half east of UTC"
        );
        assert_eq!(parse_datetime("2026-11-30T19:00:00-0500"), Ok(NOW));
        assert_eq!(
            parse_datetime("2024-02-29T12:00:00Z"),
            Ok(1_709_208_000_000)
        );
        for bad in [
            "2026-12-01",
            "2026-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-12-01T24:00:00Z",
            "2026-12-01T00:00Z",
            "2026-12-01T00:00:00+25:00",
            "yesterday",
        ] {
            assert!(parse_datetime(bad).is_err(), "{bad} is refused");
        }
        assert_eq!(iso_utc(NOW + 1_234), "2026-12-01T00:00:01.234Z");
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn durations_are_iso_8601_or_the_runtimes_own() {
        let millis = |text: &str| parse_lookback(text).map(|d| d.as_millis_i64());
        assert_eq!(millis("PT1H"), Ok(3_600_000));
        assert_eq!(millis("P1D"), Ok(86_400_000));
        assert_eq!(millis("P1DT2H3M4.5S"), Ok(93_784_500));
        assert_eq!(millis("pt30m"), Ok(1_800_000));
        assert_eq!(millis("1h"), Ok(3_600_000));
        assert_eq!(millis("7d"), Ok(604_800_000));
        for bad in [
            "P", "PT", "PT1M1H", "P1H", "PT1.5M", "PT-1H", "P1W", "1 hour",
        ] {
            assert!(parse_lookback(bad).is_err(), "{bad} is refused");
        }
    }
}
