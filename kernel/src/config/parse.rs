//! Phase 1: JSON text into raw serde structs, one section at a time.
//!
//! `deny_unknown_fields` stops at the first bad field, so each key of a
//! section is first deserialized on its own (a one-key object into the same
//! struct); the keys that pass are then deserialized together. Every bad key
//! becomes an issue at its own location and the rest still get checked.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;

use hivekernel_agents::LimitOverrides;
use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeOwned, DeserializeSeed, MapAccess, Visitor};
use serde_json::{Map, Value};
use validator::{Validate, ValidationError, ValidationErrors, ValidationErrorsKind};

use super::{ConfigIssue, at, validate};

/// The top level: which sections are present.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct Document {
    pub(super) kernel: Option<Value>,
    pub(super) llm: Option<Value>,
    pub(super) tool_agent: Option<Value>,
    pub(super) roles: Option<Value>,
    pub(super) agents: Option<Vec<Value>>,
    pub(super) templates: Option<Vec<Value>>,
    pub(super) mcp_servers: Option<Value>,
}

/// One `agents[i]` entry as written; `limits` and `metadata` are parsed as sections of their own.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawAgent {
    pub(super) name: Option<String>,
    pub(super) role: Option<String>,
    pub(super) cognitive_tier: Option<String>,
    pub(super) model: String,
    pub(super) runtime: Option<String>,
    pub(super) system_prompt: String,
    pub(super) system_prompt_file: Option<String>,
    pub(super) tools: Vec<String>,
    pub(super) workspace: Option<String>,
    pub(super) limits: Option<Value>,
    pub(super) metadata: Option<Value>,
    pub(super) restart: Option<Value>,
    pub(super) strategy: Option<String>,
    /// Read by `cron::agent_entries`.
    pub(super) cron: Option<Value>,
    pub(super) command: Option<Vec<String>>,
    pub(super) env: Option<BTreeMap<String, String>>,
    pub(super) approval: Option<Value>,
    pub(super) skills: Vec<String>,
    /// The node of a cluster it runs on.
    pub(super) node: Option<String>,
    /// Labels the node it runs on must have (`where`).
    #[serde(rename = "where")]
    pub(super) node_labels: Option<BTreeMap<String, String>>,
}

/// An agent entry after phase 1.
#[derive(Debug)]
pub(super) struct Agent {
    pub(super) index: usize,
    /// `agents[2] (coder)`, or `agents[2]` when the name is unusable.
    pub(super) label: String,
    pub(super) fields: Section<RawAgent>,
    pub(super) limits: Section<LimitOverrides>,
    pub(super) metadata: Section<BTreeMap<String, String>>,
}

/// A section built from the keys that parsed, remembering the ones that did not.
#[derive(Debug)]
pub(super) struct Section<T> {
    pub(super) value: T,
    bad: BTreeSet<String>,
    /// The section itself had the wrong type, so every field is unknown.
    broken: bool,
}

impl<T> Section<T> {
    /// Whether `field` parsed (given or defaulted), so later checks may trust it.
    pub(super) fn is_ok(&self, field: &str) -> bool {
        !self.broken && !self.bad.contains(field)
    }
}

/// For a key that its own function reads (with the environment or the
/// config's directory): accepted where its section is deserialized, so the
/// section knows it among its keys, and left at its default there.
pub(super) fn read_apart<'de, D: serde::Deserializer<'de>, T: Default>(
    deserializer: D,
) -> Result<T, D::Error> {
    serde::de::IgnoredAny::deserialize(deserializer)?;
    Ok(T::default())
}

/// For a field holding a struct: only a JSON object, which serde's derive
/// would also take as an array of the fields in order. The fields are read
/// through the caller's map, so a problem inside is still reported at its
/// own path.
pub(super) fn object<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    deserializer.deserialize_map(Object(PhantomData))
}

/// [`object`] for each value of a map of structs (`llm.prices`).
pub(super) fn object_values<'de, D, T>(deserializer: D) -> Result<BTreeMap<String, T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Entries<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Entries<T> {
        type Value = BTreeMap<String, T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut entries = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                let value = map.next_value_seed(Object(PhantomData))?;
                entries.insert(key, value);
            }
            Ok(entries)
        }
    }
    deserializer.deserialize_map(Entries(PhantomData))
}

/// Reads a `T` from a JSON object only (see [`object`]).
struct Object<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for Object<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map))
    }
}

impl<'de, T: Deserialize<'de>> DeserializeSeed<'de> for Object<T> {
    type Value = T;
    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<T, D::Error> {
        deserializer.deserialize_map(self)
    }
}

/// Parses the whole file; `None` when there is nothing further to check.
pub(super) fn document(text: &str, issues: &mut Vec<ConfigIssue>) -> Option<Document> {
    let value: Value = match hivekernel_agents::json::parse(text) {
        Ok(value) => value,
        Err(err) => {
            issues.push(ConfigIssue::new("", format!("invalid JSON: {err}")));
            return None;
        }
    };
    if !value.is_object() {
        issues.push(ConfigIssue::new(
            "",
            format!(
                "the config must be a JSON object, found {}",
                describe(&value)
            ),
        ));
        return None;
    }
    Some(section::<Document>(Some(&value), "", issues).value)
}

/// Parses `agents[index]`; `None` when it is not an object at all.
pub(super) fn agent(index: usize, value: &Value, issues: &mut Vec<ConfigIssue>) -> Option<Agent> {
    entry("agents", index, value, issues)
}

/// Parses `<list>[index]` as an agent entry (`agents`, `templates`).
pub(super) fn entry(
    list: &str,
    index: usize,
    value: &Value,
    issues: &mut Vec<ConfigIssue>,
) -> Option<Agent> {
    let Value::Object(map) = value else {
        issues.push(ConfigIssue::new(
            format!("{list}[{index}]"),
            format!("an agent must be a JSON object, found {}", describe(value)),
        ));
        return None;
    };
    let name = map
        .get("name")
        .and_then(Value::as_str)
        .filter(|name| validate::name_problem(name).is_none());
    let label = match name {
        Some(name) => format!("{list}[{index}] ({name})"),
        None => format!("{list}[{index}]"),
    };
    let fields = section::<RawAgent>(Some(value), &label, issues);
    let limits = section(fields.value.limits.as_ref(), &at(&label, "limits"), issues);
    let metadata = section(
        fields.value.metadata.as_ref(),
        &at(&label, "metadata"),
        issues,
    );
    Some(Agent {
        index,
        label,
        fields,
        limits,
        metadata,
    })
}

/// Deserializes an object key by key, so every bad key is reported at its own location.
pub(super) fn section<T: DeserializeOwned + Default>(
    value: Option<&Value>,
    location: &str,
    issues: &mut Vec<ConfigIssue>,
) -> Section<T> {
    let mut section = Section {
        value: T::default(),
        bad: BTreeSet::new(),
        broken: false,
    };
    let map = match value {
        None | Some(Value::Null) => return section,
        Some(Value::Object(map)) => map,
        Some(other) => {
            issues.push(ConfigIssue::new(
                location,
                format!("expected a JSON object, found {}", describe(other)),
            ));
            section.broken = true;
            return section;
        }
    };
    let mut good = Map::new();
    for (key, field) in map {
        let mut alone = Value::Object(Map::from_iter([(key.clone(), field.clone())]));
        // Each failure is reported and its value taken out, so that the
        // rest of a nested value is still read and every problem in it is
        // reported; a value past the failures is kept for later checks.
        for _ in 0..MAX_ISSUES_PER_KEY {
            let err = match serde_path_to_error::deserialize::<_, T>(&alone) {
                Ok(_) => {
                    if let Value::Object(mut parsed) = alone {
                        good.extend(parsed.remove(key).map(|field| (key.clone(), field)));
                    }
                    break;
                }
                Err(err) => err,
            };
            // The path starts at the key; deeper when a nested value failed.
            let path = err.path().to_string();
            let path = if path.starts_with(key.as_str()) {
                path
            } else {
                key.clone()
            };
            issues.push(ConfigIssue::new(
                at(location, &path),
                err.inner().to_string(),
            ));
            section.bad.insert(key.clone());
            if !remove_nested(&mut alone, err.path()) {
                break;
            }
        }
    }
    // Each key parsed alone, so together they parse too; the branch is defensive.
    match T::deserialize(&Value::Object(good)) {
        Ok(value) => section.value = value,
        Err(err) => {
            issues.push(ConfigIssue::new(location, err.to_string()));
            section.broken = true;
        }
    }
    section
}

/// Parses a settings section (as [`section`] does), then checks the ranges
/// and lengths its type declares in `#[validate]` attributes: every value
/// out of bounds is an issue at its own path.
pub(super) fn settings<T: DeserializeOwned + Default + Validate>(
    value: Option<&Value>,
    location: &str,
    issues: &mut Vec<ConfigIssue>,
) -> Section<T> {
    let mut section = section::<T>(value, location, issues);
    if let Err(errors) = section.value.validate() {
        let mut found = Vec::new();
        flatten(&errors, location, &mut found);
        found.sort_by(|a, b| a.0.cmp(&b.0));
        for (path, error) in found {
            if let Some(field) = path
                .strip_prefix(location)
                .map(|p| p.trim_start_matches('.'))
            {
                let field = field.split(['.', '[']).next().unwrap_or(field);
                section.bad.insert(field.to_owned());
            }
            issues.push(ConfigIssue::new(path, message(error)));
        }
    }
    section
}

/// Every error of a validation with its dotted path below `location`.
fn flatten<'e>(
    errors: &'e ValidationErrors,
    location: &str,
    out: &mut Vec<(String, &'e ValidationError)>,
) {
    for (field, kind) in errors.errors() {
        let path = at(location, field);
        match kind {
            ValidationErrorsKind::Field(list) => out.extend(list.iter().map(|e| (path.clone(), e))),
            ValidationErrorsKind::Struct(inner) => flatten(inner, &path, out),
            ValidationErrorsKind::List(items) => {
                for (index, inner) in items {
                    flatten(inner, &format!("{path}[{index}]"), out);
                }
            }
        }
    }
}

/// What a failed check says: the bounds and the value for a range or a
/// length, the check's own message otherwise.
fn message(error: &ValidationError) -> String {
    if let Some(message) = &error.message {
        return message.to_string();
    }
    let param = |name: &str| error.params.get(name).map(Value::to_string);
    let got = param("value")
        .map(|v| format!(", got {v}"))
        .unwrap_or_default();
    match (error.code.as_ref(), param("min"), param("max")) {
        ("range", Some(min), Some(max)) => format!("must be between {min} and {max}{got}"),
        ("range", Some(min), None) => format!("must be at least {min}{got}"),
        ("range", None, Some(max)) => format!("must be at most {max}{got}"),
        ("length", Some(min), Some(max)) => format!("must have {min} to {max} entries"),
        ("length", Some(min), None) => format!("must have at least {min} entries"),
        ("length", None, Some(max)) => format!("must have at most {max} entries"),
        (code, _, _) => format!("failed the {code} check"),
    }
}

/// Most problems reported inside one key of a section.
const MAX_ISSUES_PER_KEY: usize = 64;

/// Takes the entry at `path` out of its object, when it is below the
/// section's own key and its parent is an object (an array's entries would
/// shift the next indices); whether it did.
fn remove_nested(value: &mut Value, path: &serde_path_to_error::Path) -> bool {
    use serde_path_to_error::Segment;
    let segments: Vec<&Segment> = path.iter().collect();
    let Some((Segment::Map { key: last }, parents)) = segments.split_last() else {
        return false;
    };
    if parents.is_empty() {
        return false;
    }
    let mut at = value;
    for segment in parents {
        at = match (segment, at) {
            (Segment::Map { key }, Value::Object(map)) => match map.get_mut(key) {
                Some(next) => next,
                None => return false,
            },
            (Segment::Seq { index }, Value::Array(items)) => match items.get_mut(*index) {
                Some(next) => next,
                None => return false,
            },
            _ => return false,
        };
    }
    match at {
        Value::Object(map) => map.remove(last).is_some(),
        _ => false,
    }
}

/// A JSON value as a message shows it: its kind, and the value when short.
pub(super) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "an array".to_owned(),
        Value::Object(_) => "an object".to_owned(),
    }
}
