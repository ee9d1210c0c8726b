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

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for byte in bytes {
        write!(f, "{byte:02x}")?;
    }
    Ok(())
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl Serialize for TraceId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TraceId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        TraceId::parse(&text).ok_or_else(|| serde::de::Error::custom("not a trace id"))
    }
}

impl Serialize for SpanId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SpanId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        hex::<8>(&text)
            .map(SpanId)
            .ok_or_else(|| serde::de::Error::custom("not a span id"))
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
}
