//! `hivekernel skills`: `ls` and `show` ask a running kernel what it
//! loaded and what processes saved; `history` and `rm` read and delete
//! saved skills; `check DIR` checks skills in the Agent Skills format as
//! strictly as the format asks, without a kernel.

use std::path::{Path, PathBuf};

use hivekernel_agents::skill::{self, Read, SKILL_FILE, Severity, Strictness};
use hivekernel_proto::v1::{
    GetSkillRequest, ListSkillsRequest, ManageSkillRequest, SkillHistoryRequest, SkillInfo,
    SkillVersion,
};
use serde_json::{Value, json};

use super::client::Session;
use super::{CliError, ClientArgs, output};

/// Lists the loaded skills, then the problems of the last load.
pub(super) async fn ls(as_json: bool, client: &ClientArgs) -> Result<(), CliError> {
    let mut session = Session::connect(client).await?;
    let answer = session
        .client
        .list_skills(ListSkillsRequest {})
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    if as_json {
        let problems: Vec<Value> = answer
            .problems
            .iter()
            .map(|p| json!({"path": p.path, "message": p.message, "skipped": p.skipped}))
            .collect();
        let all = json!({
            "skills": answer.skills.iter().map(info_json).collect::<Vec<_>>(),
            "problems": problems,
        });
        return output::print(&output::line(&all.to_string()));
    }
    let mut text = String::new();
    if answer.skills.is_empty() {
        text.push_str("no skills loaded (kernel.skills, or an agent's skills, in the config)\n");
    } else {
        let mut rows = vec![["NAME", "SCOPE", "SOURCE", "DESCRIPTION"].map(str::to_owned)];
        for info in &answer.skills {
            let mut name = info.name.clone();
            if info.shadowed {
                name.push_str(" (shadowed)");
            }
            let scope = if info.scope.is_empty() {
                "-".to_owned()
            } else {
                info.scope.join(",")
            };
            let description = info
                .description
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            rows.push([
                name,
                scope,
                info.source.clone(),
                hivekernel_agents::text::cut_str(&description, 80),
            ]);
        }
        text.push_str(&output::aligned(&rows));
    }
    for problem in &answer.problems {
        let what = if problem.skipped {
            "skipped"
        } else {
            "warning"
        };
        text.push_str(&output::line(&format!(
            "{what}: {}: {}",
            problem.path, problem.message
        )));
    }
    output::print(&text)
}

/// Shows one skill: its fields, then its body.
pub(super) async fn show(
    name: &str,
    owner: Option<u64>,
    as_json: bool,
    client: &ClientArgs,
) -> Result<(), CliError> {
    let mut session = Session::connect(client).await?;
    let skill = session
        .client
        .get_skill(GetSkillRequest {
            name: name.to_owned(),
            owner: owner.unwrap_or(0),
        })
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    let info = skill.info.unwrap_or_default();
    if as_json {
        let mut all = info_json(&info);
        all["body"] = Value::from(skill.body);
        return output::print(&output::line(&all.to_string()));
    }
    let mut rows = vec![
        ["name".to_owned(), info.name.clone()],
        ["description".to_owned(), info.description.clone()],
        ["source".to_owned(), info.source.clone()],
    ];
    match &info.saved {
        Some(saved) => rows.push(["visibility".to_owned(), saved.visibility.clone()]),
        None => rows.insert(2, ["dir".to_owned(), info.dir.clone()]),
    }
    let optional = [
        ("license", info.license.clone()),
        ("compatibility", info.compatibility.clone()),
        ("allowed-tools", info.allowed_tools.join(" ")),
    ];
    for (field, value) in optional {
        if !value.is_empty() {
            rows.push([field.to_owned(), value]);
        }
    }
    let mut metadata: Vec<_> = info.metadata.iter().collect();
    metadata.sort();
    for (key, value) in metadata {
        rows.push([format!("metadata.{key}"), value.clone()]);
    }
    let mut text = String::new();
    for [field, value] in rows {
        text.push_str(&output::line(&format!("{field}: {value}")));
    }
    text.push('\n');
    text.push_str(&output::line(skill.body.trim_end()));
    output::print(&text)
}

fn info_json(info: &SkillInfo) -> Value {
    json!({
        "name": info.name,
        "description": info.description,
        "source": info.source,
        "scope": info.scope,
        "shadowed": info.shadowed,
        "dir": info.dir,
        "license": (!info.license.is_empty()).then_some(&info.license),
        "compatibility": (!info.compatibility.is_empty()).then_some(&info.compatibility),
        "allowed_tools": info.allowed_tools,
        "metadata": info.metadata,
        "saved": info.saved.as_ref().map(|s| json!({
            "owner": s.owner,
            "owner_name": s.owner_name,
            "visibility": s.visibility,
            "version": s.version,
            "updated_at_unix_ms": s.updated_at_unix_ms,
        })),
    })
}

/// Prints the kept versions of a saved skill.
pub(super) async fn history(
    name: &str,
    owner: Option<u64>,
    as_json: bool,
    client: &ClientArgs,
) -> Result<(), CliError> {
    let mut session = Session::connect(client).await?;
    let versions = session
        .client
        .skill_history(SkillHistoryRequest {
            name: name.to_owned(),
            owner: owner.unwrap_or(0),
            content: as_json,
        })
        .await
        .map_err(|status| session.error(status))?
        .into_inner()
        .versions;
    if as_json {
        let all: Vec<Value> = versions.iter().map(version_json).collect();
        return output::print(&output::line(&Value::from(all).to_string()));
    }
    let mut rows = vec![
        [
            "OWNER",
            "VERSION",
            "ACTION",
            "BY",
            "AT",
            "VISIBILITY",
            "REASON",
        ]
        .map(str::to_owned),
    ];
    for v in &versions {
        rows.push([
            format!("{} ({})", v.owner, v.owner_name),
            v.version.to_string(),
            v.action.clone(),
            format!("{} ({})", v.by, v.by_name),
            output::rfc3339_utc(v.at_unix_ms),
            v.visibility.clone(),
            if v.reason.is_empty() {
                "-".to_owned()
            } else {
                hivekernel_agents::text::cut_str(&v.reason, 60)
            },
        ]);
    }
    output::print(&output::aligned(&rows))
}

/// Deletes a saved skill as the operator.
pub(super) async fn rm(
    name: &str,
    owner: Option<u64>,
    reason: Option<String>,
    client: &ClientArgs,
) -> Result<(), CliError> {
    let mut session = Session::connect(client).await?;
    let version = session
        .client
        .manage_skill(ManageSkillRequest {
            action: "delete".to_owned(),
            name: name.to_owned(),
            owner: owner.unwrap_or(0),
            reason: reason.unwrap_or_default(),
            ..ManageSkillRequest::default()
        })
        .await
        .map_err(|status| session.error(status))?
        .into_inner();
    output::print(&output::line(&format!(
        "deleted skill {} of process {} (version {} in its history)",
        version.name, version.owner, version.version
    )))
}

fn version_json(v: &SkillVersion) -> Value {
    json!({
        "name": v.name,
        "owner": v.owner,
        "owner_name": v.owner_name,
        "version": v.version,
        "action": v.action,
        "by": v.by,
        "by_name": v.by_name,
        "visibility": v.visibility,
        "at_unix_ms": v.at_unix_ms,
        "reason": (!v.reason.is_empty()).then_some(&v.reason),
        "content": (v.action != "delete").then_some(&v.content),
    })
}

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
