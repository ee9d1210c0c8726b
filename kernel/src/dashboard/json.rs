//! The Kernel service's messages as JSON: the canonical proto3 mapping
//! (lowerCamelCase names, enums by name), with 64-bit integers as numbers
//! (PIDs and token counts stay far below 2^53) and every field written,
//! defaults too, so a page reads `mailboxLen: 0` rather than nothing.
//! Read from the same descriptors the server's reflection serves.

use std::sync::OnceLock;

use bytes::Bytes;
use hivekernel_proto::v1 as pb;
use prost::Message as _;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, MethodDescriptor, SerializeOptions,
};
use serde::Serialize;

const SERVICE: &str = "hivekernel.v1.Kernel";
/// The message of the event stream, the busiest a page reads.
const EVENT: &str = "hivekernel.v1.Event";

/// An event as [`Schema::response`] writes it without reflection: the
/// same names and values (a test holds the two to each other).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct EventJson<'a> {
    seq: u64,
    at_unix_ms: u64,
    pid: u64,
    r#type: &'a str,
    detail: &'a str,
    trace_id: &'a str,
    node: &'a str,
}

impl<'a> From<&'a pb::Event> for EventJson<'a> {
    fn from(event: &'a pb::Event) -> Self {
        EventJson {
            seq: event.seq,
            at_unix_ms: event.at_unix_ms,
            pid: event.pid,
            r#type: &event.r#type,
            detail: &event.detail,
            trace_id: &event.trace_id,
            node: &event.node,
        }
    }
}

/// The service's methods and their message types, read from the
/// descriptors built with the proto crate on the first call that needs
/// them: decoding them takes about a millisecond, which a kernel's start
/// does not wait for.
#[derive(Debug, Default)]
pub struct Schema {
    pool: OnceLock<Result<DescriptorPool, String>>,
}

impl Schema {
    /// The schema, its descriptors read at once (the dashboard reads them
    /// on its first call instead: [`Schema::default`]).
    pub fn load() -> Result<Schema, String> {
        let schema = Schema::default();
        schema.pool()?;
        Ok(schema)
    }

    /// The descriptors, decoded on first use.
    fn pool(&self) -> Result<&DescriptorPool, String> {
        let pool = self.pool.get_or_init(|| {
            let pool = DescriptorPool::decode(hivekernel_proto::FILE_DESCRIPTOR_SET)
                .map_err(|err| format!("the built-in descriptors do not decode: {err}"))?;
            if pool.get_service_by_name(SERVICE).is_none() {
                return Err(format!("the built-in descriptors have no {SERVICE}"));
            }
            Ok(pool)
        });
        pool.as_ref().map_err(Clone::clone)
    }

    /// The method called `name` (`GetProcess`), if there is one; an error
    /// when the built-in descriptors do not read.
    pub fn method(&self, name: &str) -> Result<Option<MethodDescriptor>, String> {
        let Some(service) = self.pool()?.get_service_by_name(SERVICE) else {
            return Ok(None);
        };
        Ok(service.methods().find(|method| method.name() == name))
    }

    /// `json`, a request of `method`, encoded; the error names the field.
    pub fn request(&self, method: &MethodDescriptor, json: &[u8]) -> Result<Bytes, String> {
        let json = if json.iter().all(u8::is_ascii_whitespace) {
            b"{}".as_slice()
        } else {
            json
        };
        let refused =
            |err: serde_json::Error| format!("the body is not a {}: {err}", method.input().name());
        // Repeated keys are refused first: which of two would count is a guess.
        let value = hivekernel_agents::json::parse_slice(json).map_err(refused)?;
        let message = DynamicMessage::deserialize_with_options(
            method.input(),
            value,
            &DeserializeOptions::new().deny_unknown_fields(true),
        )
        .map_err(refused)?;
        Ok(Bytes::from(message.encode_to_vec()))
    }

    /// An encoded answer of `method`, as JSON.
    pub fn response(&self, method: &MethodDescriptor, encoded: Bytes) -> Result<Vec<u8>, String> {
        if method.output().full_name() == EVENT {
            let event = pb::Event::decode(encoded)
                .map_err(|err| format!("the answer does not decode: {err}"))?;
            // Numbers and strings only: it cannot fail.
            return Ok(serde_json::to_vec(&EventJson::from(&event)).unwrap_or_default());
        }
        self.reflected(method, encoded)
    }

    /// [`Schema::response`] through the descriptors, for any message.
    fn reflected(&self, method: &MethodDescriptor, encoded: Bytes) -> Result<Vec<u8>, String> {
        let message = DynamicMessage::decode(method.output(), encoded)
            .map_err(|err| format!("the answer does not decode: {err}"))?;
        let mut out = serde_json::Serializer::new(Vec::new());
        message
            .serialize_with_options(
                &mut out,
                &SerializeOptions::new()
                    .stringify_64_bit_integers(false)
                    .skip_default_fields(false),
            )
            .map_err(|err| format!("the answer does not serialize: {err}"))?;
        Ok(out.into_inner())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use hivekernel_proto::v1 as pb;

    use super::*;

    #[test]
    fn requests_read_the_canonical_names_and_refuse_unknown_fields() {
        let schema = Schema::load().unwrap();
        let method = schema.method("Kill").unwrap().unwrap();
        let encoded = schema
            .request(&method, br#"{"pid": 12, "reason": "done"}"#)
            .unwrap();
        let kill = pb::KillRequest::decode(encoded).unwrap();
        assert_eq!((kill.pid, kill.reason.as_str()), (12, "done"));
        let err = schema
            .request(&method, br#"{"pid": 12, "pdi": 3}"#)
            .unwrap_err();
        assert!(err.contains("KillRequest") && err.contains("pdi"), "{err}");
        let err = schema
            .request(&method, br#"{"pid": "twelve"}"#)
            .unwrap_err();
        assert!(err.contains("KillRequest"), "{err}");
        assert!(schema.request(&method, b"{} trailing").is_err());
        assert!(schema.request(&method, b" ").is_ok());
        assert!(schema.method("NoSuchMethod").unwrap().is_none());
    }

    #[test]
    fn answers_write_every_field_with_numbers_and_enum_names() {
        let schema = Schema::load().unwrap();
        let method = schema.method("GetProcess").unwrap().unwrap();
        let info = pb::ProcessInfo {
            pid: 7,
            name: "queen".to_owned(),
            state: pb::ProcessState::Running as i32,
            ..Default::default()
        };
        let json = schema
            .response(&method, Bytes::from(info.encode_to_vec()))
            .unwrap();
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value["pid"], 7);
        assert_eq!(value["name"], "queen");
        assert_eq!(value["state"], "PROCESS_STATE_RUNNING");
        assert_eq!(value["mailboxLen"], 0);
    }

    #[test]
    fn an_event_is_written_as_the_descriptors_would_write_it() {
        let schema = Schema::load().unwrap();
        let method = schema.method("SubscribeEvents").unwrap().unwrap();
        for event in [
            pb::Event {
                seq: 1 << 40,
                at_unix_ms: 1_790_000_000_000,
                pid: 7,
                r#type: "tool_call".to_owned(),
                detail: r#"{"tool":"shell_exec","ok":false,"error":"\"quoted\"\n\u00e9"}"#
                    .to_owned(),
                trace_id: "0af7651916cd43dd8448eb211c80319c".to_owned(),
                node: "b-2".to_owned(),
            },
            pb::Event::default(),
        ] {
            let encoded = Bytes::from(event.encode_to_vec());
            let fast: serde_json::Value =
                serde_json::from_slice(&schema.response(&method, encoded.clone()).unwrap())
                    .unwrap();
            let reflected: serde_json::Value =
                serde_json::from_slice(&schema.reflected(&method, encoded).unwrap()).unwrap();
            assert_eq!(fast, reflected);
        }
        assert!(
            schema
                .response(&method, Bytes::from_static(b"\xff"))
                .is_err()
        );
    }
}
