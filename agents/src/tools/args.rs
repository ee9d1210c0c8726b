//! Decoding a tool's JSON arguments, with errors that name the field.

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::{Tool, ToolError};

/// Decodes `tool`'s arguments; a value of the wrong type is named by its
/// field (serde alone says only what type it expected). No arguments at all
/// reads as `{}`; anything else but an object is refused (serde would read an
/// array as the fields in order).
pub fn decode<T: DeserializeOwned>(tool: &dyn Tool, args: Value) -> Result<T, ToolError> {
    let args = if args.is_null() { json!({}) } else { args };
    if !args.is_object() {
        return Err(invalid(
            tool,
            format!(
                "invalid type: the arguments must be a JSON object, got {}",
                shown(&args)
            ),
        ));
    }
    if let Some(why) = mismatch(&tool.parameters(), &args, "") {
        return Err(invalid(tool, why));
    }
    serde_json::from_value(args).map_err(|err| invalid(tool, err))
}

/// Most bytes of the reason an argument error carries: a reason may quote
/// the bad value, which may be megabytes long.
const MAX_REASON_BYTES: usize = 1024;

/// An argument error for `tool`.
pub(crate) fn invalid(tool: &dyn Tool, why: impl std::fmt::Display) -> ToolError {
    let why = crate::text::cut(why.to_string(), MAX_REASON_BYTES);
    ToolError::new(format!("invalid arguments for {}: {why}", tool.name()))
}

/// The first argument whose JSON type differs from the schema's, described;
/// nested objects are checked too and named by their path (`limits.max_depth`).
fn mismatch(schema: &Value, args: &Value, prefix: &str) -> Option<String> {
    let properties = schema.get("properties")?.as_object()?;
    let required = schema.get("required").and_then(Value::as_array);
    for (name, value) in args.as_object()? {
        let Some(property) = properties.get(name) else {
            continue; // unknown fields are named by serde
        };
        let field = format!("{prefix}{name}");
        let is_required = required.is_some_and(|r| r.iter().any(|f| f == name.as_str()));
        if value.is_null() && !is_required {
            continue; // an optional field given as null
        }
        if let Some(why) = wrong_type(property, value, &field) {
            return Some(why);
        }
        if value.is_object()
            && let Some(why) = mismatch(property, value, &format!("{field}."))
        {
            return Some(why);
        }
    }
    None
}

/// Why `value` does not fit `property`'s type, if it does not.
fn wrong_type(property: &Value, value: &Value, field: &str) -> Option<String> {
    let (fits, wanted) = match property.get("type").and_then(Value::as_str)? {
        "string" => (value.is_string(), "a string"),
        "integer" => (value.is_u64(), "a non-negative integer"),
        "object" => (value.is_object(), "an object"),
        "array" => (value.is_array(), "an array"),
        _ => return None,
    };
    if !fits {
        return Some(format!(
            "field `{field}` must be {wanted}, got {}",
            shown(value)
        ));
    }
    let items = property.get("items")?;
    value
        .as_array()?
        .iter()
        .enumerate()
        .find_map(|(i, item)| wrong_type(items, item, &format!("{field}[{i}]")))
}

/// `value` as JSON, cut to about [`SHOWN_BYTES`](crate::text::SHOWN_BYTES).
fn shown(value: &Value) -> String {
    crate::text::cut(value.to_string(), crate::text::SHOWN_BYTES)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn mismatch_names_the_field_and_its_path() {
        let schema = json!({
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "offset": {"type": "integer"},
                "tools": {"type": "array", "items": {"type": "string"}},
                "limits": {"type": "object", "properties": {"max_depth": {"type": "integer"}}}
            },
            "required": ["path"]
        });
        let why = mismatch(&schema, &json!({"path": 5}), "").unwrap_or_default();
        assert!(why.contains("`path`") && why.contains("string"), "{why}");
        let why = mismatch(&schema, &json!({"path": "a", "offset": -1}), "").unwrap_or_default();
        assert!(why.contains("`offset`"), "{why}");
        let why =
            mismatch(&schema, &json!({"path": "a", "tools": ["x", 1]}), "").unwrap_or_default();
        assert!(why.contains("`tools[1]`"), "{why}");
        let why = mismatch(
            &schema,
            &json!({"path": "a", "limits": {"max_depth": "9"}}),
            "",
        )
        .unwrap_or_default();
        assert!(why.contains("`limits.max_depth`"), "{why}");
        assert_eq!(
            mismatch(&schema, &json!({"path": "a", "offset": null}), ""),
            None
        );
        assert!(mismatch(&schema, &json!({"path": null}), "").is_some());
    }
}
