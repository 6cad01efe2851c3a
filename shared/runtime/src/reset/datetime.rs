//! The dates, times and durations of `reset`'s `--to-datetime` and
//! `--by-duration`, and the ISO 8601 rendering of a time in its output:
//! jiff's ISO 8601 (RFC 3339, RFC 9557) parsers and calendar, with the
//! reset's own rules on top (a time of day is needed, UTC without an
//! offset, no time zone names).

use jiff::civil::DateTime;
use jiff::fmt::temporal::{Pieces, SpanParser};
use jiff::tz::Offset;
use jiff::{SignedDuration, SpanRelativeTo};

use crate::duration::HumanDuration;

/// The epoch as a date and time in UTC. Times are counted from it on the
/// civil calendar (years -9999 to 9999), which reaches the end of 9999
/// where jiff's `Timestamp` stops a day short.
const EPOCH: DateTime = DateTime::constant(1970, 1, 1, 0, 0, 0, 0);

/// Milliseconds since the epoch of an ISO 8601 date and time:
/// `YYYY-MM-DDTHH:MM:SS`, the seconds and a fraction (`.` or `,`, up to
/// nine digits, cut to milliseconds) optional, `T`, `t` or a space between
/// date and time, or the basic form `YYYYMMDDTHHMMSS`; then `Z` or an
/// offset (`±HH`, `±HHMM`, `±HH:MM`, `±HH:MM:SS`, under a day), UTC
/// without one. A leap second (`:60`) is read as `:59`. A time zone name
/// (`[Europe/Paris]`) is refused: there is no time zone database here.
pub(super) fn parse_datetime(text: &str) -> Result<i64, String> {
    let invalid = |reason: &dyn std::fmt::Display| {
        format!(
            "invalid date and time '{text}' ({reason}): expected YYYY-MM-DDTHH:MM:SS, \
             optionally with .fff and Z or an offset such as +01:00 (UTC without one)"
        )
    };
    let pieces = Pieces::parse(text).map_err(|error| invalid(&error))?;
    let time = pieces.time().ok_or_else(|| invalid(&"no time of day"))?;
    if pieces.time_zone_annotation().is_some() {
        return Err(invalid(&"a time zone name, where only an offset is taken"));
    }
    let offset = pieces
        .offset()
        .map_or(Offset::UTC, |offset| offset.to_numeric_offset())
        .duration_since(Offset::UTC);
    if offset.abs() >= SignedDuration::from_hours(24) {
        return Err(invalid(&"an offset of a day or more"));
    }
    let since_epoch = pieces.date().to_datetime(time).duration_since(EPOCH) - offset;
    // Whole milliseconds, down: a fraction is cut, before the epoch too.
    let millis = since_epoch.as_nanos().div_euclid(1_000_000);
    i64::try_from(millis).map_err(|_| invalid(&"out of range"))
}

/// `YYYY-MM-DDTHH:MM:SS.fffZ` of milliseconds since the epoch; a time
/// outside years -9999 to 9999 (a duration back of thousands of years) as
/// milliseconds.
pub(super) fn iso_utc(millis: i64) -> String {
    match EPOCH.checked_add(SignedDuration::from_millis(millis)) {
        Ok(time) => format!("{time:.3}Z"),
        Err(_) => format!("{millis} ms since 1970-01-01T00:00:00.000Z"),
    }
}

/// A duration back from now: ISO 8601 (`PT1H`, `P2DT3H4M5.5S`, `P1W`;
/// weeks and days of 24 hours, no years or months; a fraction on the last
/// unit) or the runtime's own (`1h`, `90m`).
pub(super) fn parse_lookback(text: &str) -> Result<HumanDuration, String> {
    if !text.starts_with(['P', 'p']) {
        return text.parse();
    }
    let invalid = || {
        format!(
            "invalid duration '{text}': expected ISO 8601 PnWnDTnHnMn.nS (e.g. PT1H) or a \
             whole number followed by ms, s, m, h or d (e.g. 1h)"
        )
    };
    let span = SpanParser::new().parse_span(text).map_err(|_| invalid())?;
    let duration = span
        .to_duration(SpanRelativeTo::days_are_24_hours())
        .map_err(|_| invalid())?;
    // Without a sign (it would not start with P) it is not negative.
    let millis = u64::try_from(duration.as_millis()).map_err(|_| invalid())?;
    Ok(HumanDuration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_796_083_200_000; // 2026-12-01T00:00:00Z

    #[test]
    fn date_times_are_utc_unless_they_carry_an_offset() {
        assert_eq!(parse_datetime("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_datetime("2026-12-01T00:00:00"), Ok(NOW));
        assert_eq!(parse_datetime("2026-12-01 00:00:00z"), Ok(NOW));
        assert_eq!(parse_datetime("2026-12-01T00:00:00.5Z"), Ok(NOW + 500));
        assert_eq!(parse_datetime("2026-12-01T00:00:00.123456Z"), Ok(NOW + 123));
        assert_eq!(
            parse_datetime("2026-12-01T01:30:00+01:30"),
            Ok(NOW),
            "an hour and a half east of UTC"
        );
        assert_eq!(parse_datetime("2026-11-30T19:00:00-0500"), Ok(NOW));
        assert_eq!(parse_datetime("2026-12-01T02:00:00+02"), Ok(NOW));
        assert_eq!(parse_datetime("2026-12-01T00:00:00-00:00"), Ok(NOW));
        assert_eq!(
            parse_datetime("2024-02-29T12:00:00Z"),
            Ok(1_709_208_000_000)
        );
        assert_eq!(parse_datetime("1969-12-31T23:59:59.5Z"), Ok(-500));
        assert_eq!(
            parse_datetime("1969-12-31T23:59:59.9995Z"),
            Ok(-1),
            "down to the millisecond before the epoch too"
        );
        assert_eq!(
            parse_datetime("9999-12-31T23:59:59.999Z"),
            Ok(253_402_300_799_999)
        );
        for bad in [
            "2026-12-01",
            "2026-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-12-01T24:00:00Z",
            "2026-12-01T00:00:00+25:00",
            "2026-12-01T00:00:00+24:00",
            "2026-12-01T00:00:00+1",
            "2026-12-01T00:00:00[Europe/Paris]",
            "2026-12-01T00:00:00+01:00[Europe/Paris]",
            " 2026-12-01T00:00:00Z",
            "yesterday",
        ] {
            let error = parse_datetime(bad).expect_err(bad);
            assert!(
                error.starts_with(&format!("invalid date and time '{bad}' (")),
                "{error}"
            );
        }
    }

    /// What ISO 8601 allows besides the extended form with seconds.
    #[test]
    fn date_times_take_the_other_iso_8601_forms() {
        for (text, expected) in [
            ("2026-12-01T00:00Z", NOW),
            ("2026-12-01T01+01", NOW),
            ("2026-12-01t00:00:00Z", NOW),
            ("20261201T000000Z", NOW),
            ("2026-12-01T00:00:00,25Z", NOW + 250),
            ("2026-12-01T01:00:30+01:00:30", NOW),
            ("+002026-12-01T00:00:00Z", NOW),
            ("2026-11-30T23:59:60Z", NOW - 1_000),
        ] {
            assert_eq!(parse_datetime(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn times_are_written_in_utc_to_the_millisecond() {
        assert_eq!(iso_utc(NOW + 1_234), "2026-12-01T00:00:01.234Z");
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_utc(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(iso_utc(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        assert_eq!(
            iso_utc(i64::MIN),
            "-9223372036854775808 ms since 1970-01-01T00:00:00.000Z"
        );
    }

    #[test]
    fn durations_are_iso_8601_or_the_runtimes_own() {
        let millis = |text: &str| parse_lookback(text).map(|d| d.as_millis_i64());
        assert_eq!(millis("PT1H"), Ok(3_600_000));
        assert_eq!(millis("P1D"), Ok(86_400_000));
        assert_eq!(millis("P1DT2H3M4.5S"), Ok(93_784_500));
        assert_eq!(millis("pt30m"), Ok(1_800_000));
        assert_eq!(millis("PT1.123456S"), Ok(1_123));
        assert_eq!(millis("P0D"), Ok(0));
        assert_eq!(millis("1h"), Ok(3_600_000));
        assert_eq!(millis("7d"), Ok(604_800_000));
        // ISO 8601 besides days to seconds: weeks, a fraction on the last
        // unit, a comma for the point.
        assert_eq!(millis("P1W"), Ok(604_800_000));
        assert_eq!(millis("P1W1D"), Ok(691_200_000));
        assert_eq!(millis("PT1.5M"), Ok(90_000));
        assert_eq!(millis("PT1,5S"), Ok(1_500));
        for bad in [
            "P", "PT", "P1DT", "PT1M1H", "P1H", "PT-1H", "P1Y", "P1M", "PT.5S",
        ] {
            let error = parse_lookback(bad).expect_err(bad);
            assert!(
                error.starts_with(&format!("invalid duration '{bad}': expected ISO 8601")),
                "{error}"
            );
        }
        for bad in ["-PT1H", "1 hour"] {
            assert!(parse_lookback(bad).is_err(), "{bad} is refused");
        }
    }
}
