//! The skill methods: the loaded and saved skills and one skill's
//! instructions out; saved skills changed, and their history.

use hivekernel_agents::skill::{
    SkillAction, SkillRequest, SkillVersion, SkillVisibility, SkillWrite, Source,
};
use hivekernel_agents::{Pid, SkillEntry};
use hivekernel_proto::v1 as pb;
use tonic::Status;

use crate::kernel::{Caller, Kernel};
use crate::skills::Listed;

pub(super) fn list(kernel: &Kernel, caller: Caller) -> Result<pb::ListSkillsResponse, Status> {
    if !caller.sees_all() {
        let seen = kernel.skills().for_caller(caller)?;
        return Ok(pb::ListSkillsResponse {
            skills: seen
                .iter()
                .map(|entry| info(entry, Vec::new(), false))
                .collect(),
            problems: Vec::new(),
        });
    }
    let (listed, problems) = kernel.skills().listing(caller)?;
    Ok(pb::ListSkillsResponse {
        skills: listed
            .into_iter()
            .map(
                |Listed {
                     entry,
                     scope,
                     shadowed,
                 }| info(&entry, scope, shadowed),
            )
            .collect(),
        problems: problems
            .into_iter()
            .map(|problem| pb::SkillProblem {
                path: problem.path.display().to_string(),
                message: problem.message,
                skipped: problem.skipped,
            })
            .collect(),
    })
}

pub(super) fn get(
    kernel: &Kernel,
    caller: Caller,
    request: &pb::GetSkillRequest,
) -> Result<pb::Skill, Status> {
    let entry = kernel
        .skills()
        .get(caller, &request.name, owner(request.owner))?;
    Ok(pb::Skill {
        info: Some(info(&entry, Vec::new(), false)),
        body: entry.skill.body.clone(),
    })
}

fn info(entry: &SkillEntry, scope: Vec<String>, shadowed: bool) -> pb::SkillInfo {
    let skill = &entry.skill;
    let saved = match &entry.source {
        Source::Dir(_) => None,
        Source::Saved(saved) => Some(pb::SavedSkill {
            owner: saved.owner.0,
            owner_name: saved.owner_name.clone(),
            visibility: saved.visibility.to_string(),
            version: saved.version,
            updated_at_unix_ms: saved.updated_at_unix_ms,
        }),
    };
    pb::SkillInfo {
        saved,
        name: skill.name.clone(),
        description: skill.description.clone(),
        source: entry.source.to_string(),
        scope,
        shadowed,
        dir: skill.dir.display().to_string(),
        license: skill.license.clone().unwrap_or_default(),
        compatibility: skill.compatibility.clone().unwrap_or_default(),
        allowed_tools: skill.allowed_tools.clone(),
        metadata: skill.metadata.iter().cloned().collect(),
    }
}

pub(super) async fn manage(
    kernel: &Kernel,
    caller: Caller,
    request: pb::ManageSkillRequest,
) -> Result<pb::SkillVersion, Status> {
    let write = write(request).map_err(Status::invalid_argument)?;
    let version = kernel.skills().manage(caller, write, None).await?;
    Ok(version_pb(version))
}

pub(super) async fn history(
    kernel: &Kernel,
    caller: Caller,
    request: &pb::SkillHistoryRequest,
) -> Result<pb::SkillHistoryResponse, Status> {
    let versions = kernel
        .skills()
        .history(caller, &request.name, owner(request.owner), request.content)
        .await?;
    Ok(pb::SkillHistoryResponse {
        versions: versions.into_iter().map(version_pb).collect(),
    })
}

fn owner(pid: u64) -> Option<Pid> {
    (pid != 0).then_some(Pid(pid))
}

/// The change a request spells, or what is wrong with it: the same rules
/// as the `skill_manage` tool's arguments (an empty string is a field not
/// given, except `new` beside an `old`, which removes `old`).
fn write(request: pb::ManageSkillRequest) -> Result<SkillWrite, String> {
    let given = |text: String| (!text.is_empty()).then_some(text);
    let action = request.action.parse::<SkillAction>()?;
    let visibility = match request.visibility.as_str() {
        "" => None,
        given => Some(given.parse::<SkillVisibility>()?),
    };
    let new = if request.old.is_empty() {
        given(request.new)
    } else {
        Some(request.new)
    };
    SkillRequest {
        action,
        name: request.name,
        content: given(request.content),
        old: given(request.old),
        new,
        visibility,
        reason: given(request.reason),
        owner: owner(request.owner),
    }
    .into_write()
}

fn version_pb(version: SkillVersion) -> pb::SkillVersion {
    pb::SkillVersion {
        name: version.name,
        owner: version.owner.0,
        owner_name: version.owner_name,
        version: version.version,
        action: version.action.to_string(),
        by: version.by.0,
        by_name: version.by_name,
        visibility: version.visibility.to_string(),
        at_unix_ms: version.at_unix_ms,
        reason: version.reason.unwrap_or_default(),
        content: version.content.unwrap_or_default(),
    }
}
