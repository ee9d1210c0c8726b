//! The skill methods: the loaded skills and one skill's instructions out.

use hivekernel_agents::SkillEntry;
use hivekernel_agents::skill::Source;
use hivekernel_proto::v1 as pb;
use tonic::Status;

use crate::kernel::{Caller, Kernel};
use crate::skills::Listed;

pub(super) fn list(kernel: &Kernel, caller: Caller) -> Result<pb::ListSkillsResponse, Status> {
    if !caller.sees_all() {
        let seen = kernel.skills_for(caller)?;
        return Ok(pb::ListSkillsResponse {
            skills: seen
                .iter()
                .map(|entry| info(entry, Vec::new(), false))
                .collect(),
            problems: Vec::new(),
        });
    }
    let (listed, problems) = kernel.skill_listing(caller)?;
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

pub(super) fn get(kernel: &Kernel, caller: Caller, name: &str) -> Result<pb::Skill, Status> {
    let entry = kernel.skill(caller, name)?;
    Ok(pb::Skill {
        info: Some(info(&entry, Vec::new(), false)),
        body: entry.skill.body.clone(),
    })
}

fn info(entry: &SkillEntry, scope: Vec<String>, shadowed: bool) -> pb::SkillInfo {
    let skill = &entry.skill;
    let Source::Dir(source) = &entry.source;
    pb::SkillInfo {
        name: skill.name.clone(),
        description: skill.description.clone(),
        source: source.display().to_string(),
        scope,
        shadowed,
        dir: skill.dir.display().to_string(),
        license: skill.license.clone().unwrap_or_default(),
        compatibility: skill.compatibility.clone().unwrap_or_default(),
        allowed_tools: skill.allowed_tools.clone(),
        metadata: skill.metadata.iter().cloned().collect(),
    }
}
