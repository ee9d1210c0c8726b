//! `hivekernel skills check DIR`: checks skills in the Agent Skills format
//! as strictly as the format asks, without a kernel.

use std::path::{Path, PathBuf};

use hivekernel_agents::skill::{self, Read, SKILL_FILE, Severity, Strictness};
use serde_json::{Value, json};

use super::{CliError, output};

/// Checks the skill in `dir`, or every skill directly under it; prints every
/// finding with its file and field. Exit 2 when any skill has an error.
pub(super) fn check(dir: &Path, as_json: bool) -> Result<(), CliError> {
    let skills = skill_dirs(dir)?;
    let reads: Vec<(PathBuf, Read)> = skills
        .into_iter()
        .map(|dir| {
            let read = skill::read(&dir, Strictness::Strict);
            (dir, read)
        })
        .collect();
    let failed = reads.iter().filter(|(_, read)| read.has_errors()).count();
    if as_json {
        let report: Vec<Value> = reads.iter().map(|(dir, read)| json_of(dir, read)).collect();
        output::print(&output::line(&Value::Array(report).to_string()))?;
    } else {
        let mut text = String::new();
        for (dir, read) in &reads {
            for finding in &read.findings {
                text.push_str(&output::line(&finding.to_string()));
            }
            if !read.has_errors() {
                let name = read.skill.as_ref().map_or("", |s| s.name.as_str());
                text.push_str(&output::line(&format!("ok: {} ({name})", dir.display())));
            }
        }
        output::print(&text)?;
    }
    let total = reads.len();
    let noun = if total == 1 { "skill" } else { "skills" };
    if failed > 0 {
        return Err(CliError::Usage(format!(
            "{failed} of {total} {noun} in {} break the Agent Skills format",
            dir.display()
        )));
    }
    Ok(())
}

/// `dir` itself when it holds a `SKILL.md`, else its subdirectories that
/// do, by name.
fn skill_dirs(dir: &Path) -> Result<Vec<PathBuf>, CliError> {
    let shown = dir.display();
    let meta = std::fs::metadata(dir)
        .map_err(|err| CliError::Usage(format!("cannot read {shown}: {err}")))?;
    if !meta.is_dir() {
        return Err(CliError::Usage(format!(
            "{shown} is not a directory: name a skill directory or a directory of skills"
        )));
    }
    if dir.join(SKILL_FILE).exists() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let found =
        skill::scan(dir).map_err(|err| CliError::Usage(format!("cannot read {shown}: {err}")))?;
    if found.is_empty() {
        return Err(CliError::Usage(format!(
            "no skills in {shown}: neither it nor a directory in it holds a {SKILL_FILE}"
        )));
    }
    Ok(found)
}

fn json_of(dir: &Path, read: &Read) -> Value {
    let findings: Vec<Value> = read
        .findings
        .iter()
        .map(|f| {
            json!({
                "severity": match f.severity {
                    Severity::Warning => "warning",
                    Severity::Error => "error",
                },
                "file": f.file.display().to_string(),
                "field": f.field,
                "message": f.message,
            })
        })
        .collect();
    json!({
        "dir": dir.display().to_string(),
        "name": read.skill.as_ref().map(|s| s.name.clone()),
        "ok": !read.has_errors(),
        "findings": findings,
    })
}
