//! Arbitrary bytes as a startup config through the real parser and
//! validator: never a panic, and every refusal says something.

#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use hivekernel_kernel::RuntimeRegistry;
use hivekernel_kernel::config::{Config, Known};
use libfuzzer_sys::fuzz_target;

fn known() -> &'static Known {
    static KNOWN: OnceLock<Known> = OnceLock::new();
    KNOWN.get_or_init(|| RuntimeRegistry::builtin().known())
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // A path that does not exist: prompt files named in the input are never read.
    let path = Path::new("/nonexistent/hivekernel-fuzz/startup.json");
    if let Err(err) = Config::from_str_at(&text, path, known()) {
        assert!(!err.issues.is_empty());
        for issue in &err.issues {
            assert!(!issue.message.is_empty(), "{issue:?}");
        }
    }
});
