//! Skills processes saved with `skill_manage`, as the kernel holds them in
//! memory: read back from the store at start, changed after each committed
//! write, and judged per process by their visibility.
//!
//! A saved skill belongs to the process that created it; its name is unique
//! per owner, so two swarms may each keep a `deploy` of their own. When a
//! process sees several of one name, the nearest wins: its own, then an
//! ancestor's (the nearest first), then a descendant's, then a global one
//! from elsewhere; among equals the newest.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use hivekernel_agents::Pid;
use hivekernel_agents::skill::{
    self, Saved, Skill, SkillEntry, SkillVisibility, Source, Strictness,
};

use crate::store::{StoredSkill, in_lineage};

/// One saved skill, with the owner's line its visibility is judged by.
#[derive(Debug, Clone)]
pub(crate) struct SavedSkill {
    pub(crate) entry: SkillEntry,
    /// The same as the entry's source.
    saved: Arc<Saved>,
    /// Its `SKILL.md` as written (an edit patches it).
    pub(crate) content: Arc<str>,
    /// `/1/.../owner/`, as recorded when the skill was created.
    pub(crate) lineage: String,
}

impl SavedSkill {
    /// The skill `stored` holds, read as loading reads a `SKILL.md`
    /// (leniently: a rule tightened since it was written does not lose it).
    pub(crate) fn from_stored(stored: &StoredSkill) -> Result<SavedSkill, String> {
        let skill = parsed(&stored.name, &stored.content)?;
        Ok(SavedSkill::new(
            skill,
            stored.content.as_str().into(),
            Saved {
                owner: stored.owner,
                owner_name: stored.owner_name.clone(),
                visibility: stored.visibility,
                version: stored.version,
                updated_at_unix_ms: stored.updated_ms,
            },
            stored.lineage.clone(),
        ))
    }

    pub(crate) fn new(
        skill: Skill,
        content: Arc<str>,
        saved: Saved,
        lineage: String,
    ) -> SavedSkill {
        let saved = Arc::new(saved);
        SavedSkill {
            entry: SkillEntry {
                skill: Arc::new(skill),
                source: Source::Saved(saved.clone()),
            },
            saved,
            content,
            lineage,
        }
    }

    pub(crate) fn saved(&self) -> &Saved {
        &self.saved
    }

    pub(crate) fn name(&self) -> &str {
        &self.entry.skill.name
    }

    /// How near the owner is to process `pid` whose line from PID 1 is
    /// `line`, when `pid` sees the skill: 0 its own, then its ancestors
    /// (the nearest first), then its descendants, then global ones.
    fn nearness(&self, pid: Pid, line: &[Pid]) -> Option<usize> {
        let saved = self.saved();
        let owner = saved.owner;
        if owner == pid {
            return Some(0);
        }
        let ancestor = line.iter().rev().position(|&p| p == owner);
        let descendant = in_lineage(&self.lineage, pid);
        match saved.visibility {
            SkillVisibility::Private => None,
            SkillVisibility::Subtree | SkillVisibility::Global if ancestor.is_some() => ancestor,
            SkillVisibility::Subtree | SkillVisibility::Global if descendant => {
                Some(line.len() + 1)
            }
            SkillVisibility::Global => Some(line.len() + 2),
            SkillVisibility::Subtree => None,
        }
    }

    /// Whether process `pid` may change the skill: its owner, the owner's
    /// ancestors and PID 1 (the operator) may.
    pub(crate) fn changeable_by(&self, pid: Pid) -> bool {
        pid == Pid::KERNEL || in_lineage(&self.lineage, pid)
    }
}

/// A `SKILL.md` of a saved skill called `name`, read leniently.
pub(crate) fn parsed(name: &str, content: &str) -> Result<Skill, String> {
    let read = skill::parse(Path::new(name), content, Strictness::Lenient);
    read.skill.ok_or_else(|| {
        read.findings
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// The saved skills, by name then owner.
#[derive(Debug, Default)]
pub(crate) struct SavedSkills {
    skills: BTreeMap<(String, Pid), SavedSkill>,
}

impl SavedSkills {
    pub(crate) fn is_empty(&self) -> bool {
        self.skills.is_empty()
    }

    /// Puts `skill` in, unless a newer version of it is there already.
    pub(crate) fn put(&mut self, skill: SavedSkill) {
        let key = (skill.name().to_owned(), skill.saved().owner);
        let newer = self
            .skills
            .get(&key)
            .is_some_and(|held| held.saved().version > skill.saved().version);
        if !newer {
            self.skills.insert(key, skill);
        }
    }

    /// Takes `owner`'s skill `name` out, unless it is newer than `version`
    /// (the delete's).
    pub(crate) fn remove(&mut self, name: &str, owner: Pid, version: u64) {
        let key = (name.to_owned(), owner);
        if self
            .skills
            .get(&key)
            .is_some_and(|held| held.saved().version < version)
        {
            self.skills.remove(&key);
        }
    }

    /// The skill called `name` that process `pid` (line `line`) sees.
    pub(crate) fn find(&self, name: &str, pid: Pid, line: &[Pid]) -> Option<&SavedSkill> {
        self.named(name)
            .filter_map(|skill| Some((skill.nearness(pid, line)?, skill)))
            .min_by(|(a, x), (b, y)| {
                a.cmp(b).then(
                    y.saved()
                        .updated_at_unix_ms
                        .cmp(&x.saved().updated_at_unix_ms),
                )
            })
            .map(|(_, skill)| skill)
    }

    /// The skill called `name` that `pid` (line `line`; PID 1 for an
    /// operator) changes: `owner`'s when given; else its own, else the one
    /// it sees when it may change that, else the only one of its
    /// descendants'. `Err` with the owners when several could be meant.
    pub(crate) fn changeable(
        &self,
        name: &str,
        owner: Option<Pid>,
        pid: Pid,
        line: &[Pid],
    ) -> Result<Option<&SavedSkill>, Vec<Pid>> {
        let mut candidates: Vec<&SavedSkill> = self
            .named(name)
            .filter(|skill| skill.changeable_by(pid))
            .filter(|skill| owner.is_none_or(|o| skill.saved.owner == o))
            .collect();
        if owner.is_some() || candidates.len() <= 1 {
            return Ok(candidates.pop());
        }
        if let Some(own) = candidates.iter().find(|s| s.saved.owner == pid) {
            return Ok(Some(own));
        }
        if let Some(seen) = self.find(name, pid, line)
            && seen.changeable_by(pid)
        {
            return Ok(Some(seen));
        }
        Err(candidates.iter().map(|s| s.saved.owner).collect())
    }

    /// Every skill process `pid` (line `line`) sees, one per name.
    pub(crate) fn seen_by(&self, pid: Pid, line: &[Pid]) -> Vec<SkillEntry> {
        let mut seen: Vec<SkillEntry> = Vec::new();
        let mut last: Option<&str> = None;
        for (name, _) in self.skills.keys() {
            if last == Some(name.as_str()) {
                continue;
            }
            last = Some(name);
            if let Some(skill) = self.find(name, pid, line) {
                seen.push(skill.entry.clone());
            }
        }
        seen
    }

    /// The skills called `name`, by owner.
    pub(crate) fn named(&self, name: &str) -> impl Iterator<Item = &SavedSkill> {
        self.skills
            .range((name.to_owned(), Pid(0))..=(name.to_owned(), Pid(u64::MAX)))
            .map(|(_, skill)| skill)
    }

    /// Every saved skill, by name then owner.
    pub(crate) fn all(&self) -> impl Iterator<Item = &SavedSkill> {
        self.skills.values()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::store::lineage;

    fn saved(name: &str, owner_line: &[u64], visibility: SkillVisibility, at: u64) -> SavedSkill {
        let line: Vec<Pid> = owner_line.iter().copied().map(Pid).collect();
        let owner = *line.last().unwrap();
        let text = format!("---\nname: {name}\ndescription: By {owner}.\n---\nSteps.\n");
        SavedSkill::new(
            parsed(name, &text).unwrap(),
            text.as_str().into(),
            Saved {
                owner,
                owner_name: format!("p{owner}"),
                visibility,
                version: 1,
                updated_at_unix_ms: at,
            },
            lineage(&line),
        )
    }

    fn seen(skills: &SavedSkills, line: &[u64]) -> Vec<String> {
        let line: Vec<Pid> = line.iter().copied().map(Pid).collect();
        skills
            .seen_by(*line.last().unwrap(), &line)
            .iter()
            .map(|e| format!("{}@{}", e.skill.name, e.source.saved().unwrap().owner))
            .collect()
    }

    #[test]
    fn visibility_follows_the_tree_and_the_nearest_owner_wins() {
        // 1 ─ 2 (queen-a) ─ 3 (worker) ─ 5 (its child)
        //   └ 4 (queen-b)
        let mut skills = SavedSkills::default();
        skills.put(saved("mine", &[1, 3], SkillVisibility::Private, 1));
        skills.put(saved("swarm", &[1, 2, 3], SkillVisibility::Subtree, 1));
        skills.put(saved("everyone", &[1, 4], SkillVisibility::Global, 1));
        assert_eq!(
            seen(&skills, &[1, 2, 3]),
            ["everyone@4", "mine@3", "swarm@3"]
        );
        assert_eq!(
            seen(&skills, &[1, 2]),
            ["everyone@4", "swarm@3"],
            "an ancestor"
        );
        assert_eq!(
            seen(&skills, &[1, 2, 3, 5]),
            ["everyone@4", "swarm@3"],
            "a descendant"
        );
        assert_eq!(seen(&skills, &[1, 4]), ["everyone@4"], "another swarm");
        assert_eq!(seen(&skills, &[1, 2, 6]), ["everyone@4"], "a sibling");

        // One name, several owners: own, then the nearest ancestor, then a
        // descendant, then a global one from elsewhere.
        skills.put(saved("deploy", &[1, 4], SkillVisibility::Global, 9));
        assert_eq!(seen(&skills, &[1, 2, 3])[0], "deploy@4");
        skills.put(saved("deploy", &[1, 2, 3, 5], SkillVisibility::Subtree, 1));
        assert_eq!(seen(&skills, &[1, 2, 3])[0], "deploy@5");
        skills.put(saved("deploy", &[1, 2], SkillVisibility::Subtree, 1));
        assert_eq!(seen(&skills, &[1, 2, 3])[0], "deploy@2");
        skills.put(saved("deploy", &[1, 2, 3], SkillVisibility::Private, 1));
        assert_eq!(seen(&skills, &[1, 2, 3])[0], "deploy@3");
        assert_eq!(seen(&skills, &[1, 4])[0], "deploy@4");

        // Who may change one: its owner and the owner's ancestors.
        let swarm = skills
            .find("swarm", Pid(3), &[Pid(1), Pid(2), Pid(3)])
            .unwrap();
        assert!(swarm.changeable_by(Pid(3)) && swarm.changeable_by(Pid(2)));
        assert!(!swarm.changeable_by(Pid(4)) && !swarm.changeable_by(Pid(5)));
    }

    #[test]
    fn an_edit_takes_the_callers_own_then_the_one_it_sees_then_a_descendants() {
        let line = |pids: &[u64]| pids.iter().copied().map(Pid).collect::<Vec<_>>();
        let owner = |found: Result<Option<&SavedSkill>, Vec<Pid>>| {
            found.map(|s| s.map(|s| s.saved().owner.0))
        };
        let mut skills = SavedSkills::default();
        // Two of 2's descendants saved `s`, privately.
        skills.put(saved("s", &[1, 2, 3], SkillVisibility::Private, 1));
        skills.put(saved("s", &[1, 2, 4], SkillVisibility::Private, 1));
        let queen = line(&[1, 2]);
        assert_eq!(
            owner(skills.changeable("s", None, Pid(2), &queen)),
            Err(vec![Pid(3), Pid(4)])
        );
        assert_eq!(
            owner(skills.changeable("s", Some(Pid(4)), Pid(2), &queen)),
            Ok(Some(4))
        );
        assert_eq!(
            owner(skills.changeable("s", None, Pid(3), &line(&[1, 2, 3]))),
            Ok(Some(3))
        );
        // A sibling, another swarm, or an owner filter that matches nothing: none.
        assert_eq!(
            owner(skills.changeable("s", None, Pid(9), &line(&[1, 9]))),
            Ok(None)
        );
        assert_eq!(
            owner(skills.changeable("s", Some(Pid(3)), Pid(4), &line(&[1, 2, 4]))),
            Ok(None)
        );
        // Its own wins over its descendants'.
        skills.put(saved("s", &[1, 2], SkillVisibility::Private, 1));
        assert_eq!(
            owner(skills.changeable("s", None, Pid(2), &queen)),
            Ok(Some(2))
        );
        // The operator changes any, and is asked which when several.
        assert_eq!(
            owner(skills.changeable("s", Some(Pid(3)), Pid::KERNEL, &[Pid::KERNEL])),
            Ok(Some(3))
        );
        assert!(
            skills
                .changeable("s", None, Pid::KERNEL, &[Pid::KERNEL])
                .is_err()
        );
    }

    #[test]
    fn an_older_version_never_replaces_or_removes_a_newer_one() {
        let mut skills = SavedSkills::default();
        let mut v2 = saved("s", &[1, 2], SkillVisibility::Global, 2);
        v2.saved = Arc::new(Saved {
            version: 2,
            ..v2.saved().clone()
        });
        skills.put(v2);
        skills.put(saved("s", &[1, 2], SkillVisibility::Global, 1));
        let held = skills.find("s", Pid(2), &[Pid(1), Pid(2)]).unwrap();
        assert_eq!(held.saved().version, 2);
        skills.remove("s", Pid(2), 2);
        assert!(skills.find("s", Pid(2), &[Pid(1), Pid(2)]).is_some());
        skills.remove("s", Pid(2), 3);
        assert!(skills.is_empty());
    }
}
