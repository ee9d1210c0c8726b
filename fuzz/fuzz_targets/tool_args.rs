//! Arbitrary JSON through the tool-argument decoding of every built-in tool,
//! against each tool's real schema: never a panic, a value that is not an
//! object is refused naming the tool, and no refusal is unbounded.
//!
//! (Each tool's own argument struct is reached through its call path by the
//! `tool_args_never_panic` property test, which has a real kernel to call.)

#![no_main]

use std::sync::OnceLock;

use hivekernel_agents::tools::{ToolRegistry, decode};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn tools() -> &'static ToolRegistry {
    static TOOLS: OnceLock<ToolRegistry> = OnceLock::new();
    TOOLS.get_or_init(ToolRegistry::builtin)
}

fuzz_target!(|data: &[u8]| {
    let Ok(args) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    for name in tools().names() {
        let Some(tool) = tools().get(name) else {
            continue;
        };
        match decode::<Value>(tool.as_ref(), args.clone()) {
            Ok(_) => assert!(args.is_object() || args.is_null(), "{name} took {args}"),
            Err(err) => {
                assert!(err.0.starts_with(&format!("invalid arguments for {name}: ")), "{err}");
                assert!(err.0.len() < 2048, "{name}: {} bytes", err.0.len());
            }
        }
    }
});
