//! Trace context: which piece of work a task or message belongs to, in the
//! W3C trace-context shape (a 16-byte trace id shared by everything one
//! request caused, and an 8-byte span id per step).

use std::cell::Cell;
use std::fmt;
use std::hash::{BuildHasher, Hasher};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Everything one request caused shares this id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceId(pub [u8; 16]);

/// One step of a trace.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

/// A trace id and the span that carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TraceContext {
    /// The trace.
    pub trace_id: TraceId,
    /// This step of it.
    pub span_id: SpanId,
}

impl TraceContext {
    /// A new trace.
    pub fn new_root() -> Self {
        let high = random();
        let low = random();
        let mut trace = [0u8; 16];
        trace[..8].copy_from_slice(&high.to_be_bytes());
        trace[8..].copy_from_slice(&low.to_be_bytes());
        TraceContext {
            trace_id: TraceId(trace),
            span_id: SpanId(random().to_be_bytes()),
        }
    }

    /// A new step of the same trace.
    pub fn child(self) -> Self {
        TraceContext {
            trace_id: self.trace_id,
            span_id: SpanId(random().to_be_bytes()),
        }
    }

    /// Reads a `traceparent` header (`00-<32 hex>-<16 hex>-<2 hex>`); `None`
    /// when it is not one (an all-zero id is not one either).
    pub fn from_traceparent(text: &str) -> Option<Self> {
        let mut parts = text.trim().split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if version.len() != 2 || version == "ff" || flags.len() != 2 {
            return None;
        }
        // A future version may add fields; version 00 has exactly four.
        if version == "00" && parts.next().is_some() {
            return None;
        }
        hex::<1>(version)?;
        hex::<1>(flags)?;
        let trace_id = TraceId::parse(trace)?;
        let span_id = SpanId(hex::<8>(span)?);
        (span_id.0 != [0; 8]).then_some(TraceContext { trace_id, span_id })
    }

    /// This context as a `traceparent` header (sampled).
    pub fn to_traceparent(self) -> String {
        format!("00-{}-{}-01", self.trace_id, self.span_id)
    }
}

impl TraceId {
    /// Reads 32 lowercase or uppercase hex digits; not all zeros.
    pub fn parse(text: &str) -> Option<Self> {
        let bytes = hex::<16>(text)?;
        (bytes != [0; 16]).then_some(TraceId(bytes))
    }
}

fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// `bytes` as lowercase hex, written into `out` (twice as long). Ids are
/// written into every event and transcript entry, so this is a table
/// lookup, not a formatter call per byte.
fn to_hex<'a>(bytes: &[u8], out: &'a mut [u8]) -> &'a str {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
    std::str::from_utf8(out).unwrap_or_default()
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(to_hex(&self.0, &mut [0; 32]))
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(to_hex(&self.0, &mut [0; 16]))
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for TraceId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(to_hex(&self.0, &mut [0; 32]))
    }
}

impl<'de> Deserialize<'de> for TraceId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(HexVisitor(|text: &str| TraceId::parse(text), "a trace id"))
    }
}

impl Serialize for SpanId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(to_hex(&self.0, &mut [0; 16]))
    }
}

impl<'de> Deserialize<'de> for SpanId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(HexVisitor(
            |text: &str| hex::<8>(text).map(SpanId),
            "a span id",
        ))
    }
}

/// Reads an id from a string without copying it first.
struct HexVisitor<F>(F, &'static str);

impl<T, F: FnOnce(&str) -> Option<T>> serde::de::Visitor<'_> for HexVisitor<F> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} in hex", self.1)
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<T, E> {
        let what = self.1;
        (self.0)(text).ok_or_else(|| E::custom(format_args!("not {what}: {text:?}")))
    }
}

thread_local! {
    /// A per-thread splitmix64 state, seeded from the process's random hasher keys.
    static STATE: Cell<u64> = Cell::new({
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(std::process::id().into());
        hasher.finish() | 1
    });
}

/// A random-enough 64-bit value for ids (not for secrets).
fn random() -> u64 {
    STATE.with(|state| {
        let next = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        state.set(next);
        let mut z = next;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_nonsense_is_none() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = TraceContext::from_traceparent(text);
        assert_eq!(
            parsed.map(TraceContext::to_traceparent).as_deref(),
            Some(text)
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-é4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::from_traceparent(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn children_keep_the_trace_and_roots_differ() {
        let root = TraceContext::new_root();
        let child = root.child();
        assert_eq!(child.trace_id, root.trace_id);
        assert_ne!(child.span_id, root.span_id);
        assert_ne!(TraceContext::new_root().trace_id, root.trace_id);
        let json = serde_json::to_string(&root).unwrap_or_default();
        assert_eq!(serde_json::from_str::<TraceContext>(&json).ok(), Some(root));
    }

    #[test]
    fn ids_are_lowercase_hex_and_bad_hex_is_refused_by_name() {
        let context = TraceContext {
            trace_id: TraceId([
                0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e,
                0x47, 0x36,
            ]),
            span_id: SpanId([0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]),
        };
        let json = serde_json::to_string(&context).unwrap_or_default();
        assert_eq!(
            json,
            r#"{"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7"}"#
        );
        assert_eq!(format!("{:?}", context.span_id), "00f067aa0ba902b7");
        let bad = r#"{"trace_id":"4BF92F3577B34DA6A3CE929D0E0E473X","span_id":"00f067aa0ba902b7"}"#;
        let err = serde_json::from_str::<TraceContext>(bad)
            .err()
            .map(|err| err.to_string())
            .unwrap_or_default();
        assert!(err.contains("not a trace id"), "{err}");
        let upper =
            r#"{"trace_id":"4BF92F3577B34DA6A3CE929D0E0E4736","span_id":"00F067AA0BA902B7"}"#;
        assert_eq!(
            serde_json::from_str::<TraceContext>(upper).ok(),
            Some(context)
        );
    }
}
