//! Watermarks on the wire: how one task tells the tasks downstream of it how
//! far its event time has come.
//!
//! A task that writes a repartition topic or a stage link stamps each record
//! with its watermark at that point of its stream, and at every commit sends
//! a control record (headers only, no key or value) to every partition, for
//! readers that would otherwise hear nothing from it. Both carry the same two
//! headers, encoded and decoded only here:
//!
//! * `streams.watermark`: the watermark, an i64, big-endian;
//! * `streams.source`: the writing task (its input partition), a u32, big-endian.

use rdkafka::message::{Header, Headers, OwnedHeaders};

/// Header holding the watermark (i64, big-endian).
const WATERMARK_HEADER: &str = "streams.watermark";
/// Header naming the writing task (u32, big-endian).
const SOURCE_HEADER: &str = "streams.source";

/// The watermark of an input partition whose largest event time so far is
/// `max_event_time`: it trails by the allowed out-of-orderness. The one place
/// this formula lives.
pub(crate) fn partition_watermark(max_event_time: i64, max_out_of_orderness: i64) -> i64 {
    max_event_time.saturating_sub(max_out_of_orderness)
}

/// "Task `source` has reached `watermark`".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Announcement {
    pub source: u32,
    pub watermark: i64,
}

impl Announcement {
    /// The Kafka headers that carry this announcement.
    pub fn to_headers(self) -> OwnedHeaders {
        OwnedHeaders::new_with_capacity(2)
            .insert(Header {
                key: WATERMARK_HEADER,
                value: Some(&self.watermark.to_be_bytes()[..]),
            })
            .insert(Header {
                key: SOURCE_HEADER,
                value: Some(&self.source.to_be_bytes()[..]),
            })
    }

    /// The announcement carried by `headers`, if they hold one.
    pub fn from_headers(headers: &impl Headers) -> Option<Self> {
        let mut watermark = None;
        let mut source = None;
        for header in headers.iter() {
            match (header.key, header.value) {
                (WATERMARK_HEADER, Some(bytes)) => {
                    watermark = bytes.try_into().ok().map(i64::from_be_bytes);
                }
                (SOURCE_HEADER, Some(bytes)) => {
                    source = bytes.try_into().ok().map(u32::from_be_bytes);
                }
                _ => {}
            }
        }
        Some(Announcement {
            source: source.unwrap_or(0),
            watermark: watermark?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let announcement = Announcement {
            source: 7,
            watermark: -42,
        };
        assert_eq!(
            Announcement::from_headers(&announcement.to_headers()),
            Some(announcement)
        );
        assert_eq!(
            Announcement::from_headers(&OwnedHeaders::new()),
            None,
            "records without the header carry no watermark"
        );
    }

    #[test]
    fn partition_watermark_trails_by_the_bound() {
        assert_eq!(partition_watermark(1_000, 100), 900);
        assert_eq!(partition_watermark(i64::MIN + 1, 100), i64::MIN);
    }
}
