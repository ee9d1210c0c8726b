//! docs/CONFIG.md's field tables, rendered from the settings types
//! themselves: each field's name and type from its serde derive, its default
//! from `Default`, its range from its `#[validate]` attribute and its meaning
//! from its doc comment, all read through the type's JSON Schema. The test
//! below fails when the file says something else; run it with
//! `HIVEKERNEL_UPDATE_DOCS=1` to write the tables.

use std::fmt::Write as _;

use schemars::{JsonSchema, Schema, schema_for};
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    ArtifactSettings, ConnectionSettings, MemorySettings, StorageSettings, TranscriptSettings,
};
use crate::limits::InputLimits;
use hivekernel_agents::tool_agent::SkillPromptSettings;
use hivekernel_agents::tools::web::WebSettings;

/// One section's table: where it is in the config, and its rendering.
struct Table {
    section: &'static str,
    markdown: String,
}

/// Every section whose table is generated, in the order of the file.
fn tables() -> Vec<Table> {
    vec![
        table::<StorageSettings>("kernel.storage"),
        table::<ArtifactSettings>("kernel.artifacts"),
        table::<MemorySettings>("kernel.memory"),
        table::<TranscriptSettings>("kernel.transcripts"),
        table::<InputLimits>("kernel.limits"),
        table::<ConnectionSettings>("kernel.connections"),
        table::<SkillPromptSettings>("tool_agent.skills"),
        table::<WebSettings>("tool_agent.web"),
    ]
}

/// The field names of a struct in the order it declares them (the order
/// its serialisation writes them in; the schema's map is sorted).
struct Keys(Vec<String>);

impl<'de> Deserialize<'de> for Keys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeysVisitor;
        impl<'de> Visitor<'de> for KeysVisitor {
            type Value = Keys;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                let mut keys = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    map.next_value::<IgnoredAny>()?;
                    keys.push(key);
                }
                Ok(Keys(keys))
            }
        }
        deserializer.deserialize_map(KeysVisitor)
    }
}

fn table<T: JsonSchema + Serialize + Default>(section: &'static str) -> Table {
    let schema: Schema = schema_for!(T);
    let text = serde_json::to_string(&T::default()).expect("settings serialise");
    let Keys(order) = serde_json::from_str(&text).expect("settings serialise as an object");
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .expect("a settings type is a struct");
    let mut markdown =
        String::from("| field | type | default | range | meaning |\n|---|---|---|---|---|\n");
    for name in order {
        let field = &properties[&name];
        let _ = writeln!(
            markdown,
            "| `{name}` | {} | {} | {} | {} |",
            kind(field),
            default(&name, field),
            range(&name, field),
            meaning(field),
        );
    }
    Table { section, markdown }
}

fn kind(field: &Value) -> String {
    let of = |field: &Value| match field.get("type").and_then(Value::as_str) {
        Some("boolean") => "bool",
        Some("string") if field.get("format").and_then(Value::as_str) == Some("ip") => "IP address",
        Some("integer") => "integer",
        Some("number") => "number",
        Some("string") => "string",
        Some("array") => "array",
        _ => "object",
    };
    match (of(field), field.get("items")) {
        ("array", Some(items)) => match of(items) {
            many if many.ends_with('s') => format!("array of {many}es"),
            many => format!("array of {many}s"),
        },
        (kind, _) => kind.to_owned(),
    }
}

fn default(name: &str, field: &Value) -> String {
    match field.get("default") {
        None => String::new(),
        Some(value) => match value.as_u64().and_then(|n| unit(name, n)) {
            Some(unit) => format!("`{value}` ({unit})"),
            None => format!("`{value}`"),
        },
    }
}

fn range(name: &str, field: &Value) -> String {
    let bound = |key| field.get(key).and_then(Value::as_u64);
    match (bound("minimum"), bound("maximum")) {
        (Some(min), Some(max)) => match unit(name, max) {
            Some(unit) => format!("{min}..={max} ({unit})"),
            None => format!("{min}..={max}"),
        },
        (Some(min), None) if min > 0 => format!(">= {min}"),
        _ => String::new(),
    }
}

/// A round size or duration in a larger unit than its name gives (`_bytes`,
/// `_ms`, `_seconds`, `_hours`).
fn unit(name: &str, n: u64) -> Option<String> {
    const DAY: u64 = 86_400;
    let scaled = |n: u64, steps: &[(u64, &str)]| {
        steps
            .iter()
            .find(|(size, _)| n >= *size && n.is_multiple_of(*size))
            .map(|(size, unit)| match unit.strip_suffix('s') {
                Some(one) if n / size == 1 => format!("1 {one}"),
                _ => format!("{} {unit}", n / size),
            })
    };
    let times = [
        (365 * DAY, "years"),
        (DAY, "days"),
        (3600, "hours"),
        (60, "minutes"),
    ];
    if name.contains("bytes") {
        let sizes = [
            (1 << 40, "TiB"),
            (1 << 30, "GiB"),
            (1 << 20, "MiB"),
            (1 << 10, "KiB"),
        ];
        scaled(n, &sizes)
    } else if name.ends_with("_ms") {
        scaled(n.is_multiple_of(1000).then_some(n / 1000)?, &times)
    } else if name.ends_with("_seconds") {
        scaled(n, &times)
    } else if name.ends_with("_hours") {
        scaled(n.checked_mul(3600)?, &times[..2])
    } else {
        None
    }
}

/// The doc comment as one line (a table cell).
fn meaning(field: &Value) -> String {
    let text = ["title", "description"]
        .iter()
        .filter_map(|key| field.get(*key).and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join(" ");
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    one_line.trim_end_matches('.').replace('|', "\\|")
}

/// The file with every table rendered between its markers.
fn render(file: &str) -> Result<String, String> {
    let mut out = file.to_owned();
    for table in tables() {
        let begin = format!("<!-- fields of {} (generated) -->\n", table.section);
        let end = format!("<!-- end of {} -->", table.section);
        let start = out
            .find(&begin)
            .ok_or_else(|| format!("docs/CONFIG.md has no line {:?}", begin.trim_end()))?
            + begin.len();
        let stop = out[start..]
            .find(&end)
            .ok_or_else(|| format!("docs/CONFIG.md has no line {end:?}"))?
            + start;
        out.replace_range(start..stop, &table.markdown);
    }
    Ok(out)
}

#[test]
fn config_reference_tables_are_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/CONFIG.md");
    let file = std::fs::read_to_string(path).expect("docs/CONFIG.md reads");
    let rendered = render(&file).unwrap_or_else(|problem| panic!("{problem}"));
    if rendered == file {
        return;
    }
    if std::env::var_os("HIVEKERNEL_UPDATE_DOCS").is_some() {
        std::fs::write(path, rendered).expect("docs/CONFIG.md writes");
        return;
    }
    let first = file
        .lines()
        .zip(rendered.lines())
        .find(|(a, b)| a != b)
        .map(|(a, b)| format!("\n  file:      {a}\n  generated: {b}"))
        .unwrap_or_default();
    panic!(
        "docs/CONFIG.md's field tables are stale; write them with \
         HIVEKERNEL_UPDATE_DOCS=1 cargo test -p hivekernel-kernel --lib \
         config_reference_tables_are_current{first}"
    );
}

#[test]
fn the_tables_show_ranges_defaults_and_units() {
    let storage = table::<StorageSettings>("kernel.storage").markdown;
    assert!(
        storage.contains(
            "| `max_bytes` | integer | `8589934592` (8 GiB) | 1048576..=1099511627776 (1 TiB) | Most bytes"
        ),
        "{storage}"
    );
    let connections = table::<ConnectionSettings>("kernel.connections").markdown;
    assert!(
        connections.contains(
            "| `http_idle_timeout_ms` | integer | `60000` (1 minute) | 100..=86400000 (1 day) |"
        ),
        "{connections}"
    );
    let transcripts = table::<TranscriptSettings>("kernel.transcripts").markdown;
    assert!(
        transcripts.contains("| `enabled` | bool | `true` |  | Record every turn"),
        "{transcripts}"
    );
    assert!(
        transcripts
            .contains("| `max_age_hours` | integer | `168` (7 days) | 1..=876000 (100 years) |"),
        "{transcripts}"
    );
}
