//! The skill library: the skills in the directories the config names
//! (`kernel.skills`, agents' `skills`), loaded at start and on a reload.
//!
//! Loading is lenient, as the Agent Skills client guide asks: a skill
//! whose name breaks the format's rules is kept with a warning; one that
//! cannot be used (unreadable, frontmatter that does not parse, no
//! description, a name that cannot address it) is skipped with a warning;
//! a directory that does not exist is a warning. Nothing here fails a start.
//!
//! What a process sees is the kernel's directories, then its ancestors'
//! and last its own (a config agent's `skills`), merged by name: a later
//! directory's skill wins over an earlier one's. Within one directory two
//! skills of one name keep the first by directory name.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hivekernel_agents::Pid;
use hivekernel_agents::skill::{self, Catalogue, SkillEntry, Source, Strictness};
use parking_lot::{Mutex, RwLock};

mod saved;
pub(crate) use saved::{SavedSkill, SavedSkills};

/// One skill as `skills ls` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub entry: SkillEntry,
    /// `kernel`, or the config agents whose `skills` name its directory;
    /// for a saved skill, its visibility.
    pub scope: Vec<String>,
    /// Another directory's skill of the same name wins over it where both
    /// are seen (a later kernel directory, or an agent's; for a saved
    /// skill, any config skill of its name).
    pub shadowed: bool,
}

/// A skill or directory that was not loaded, or loaded with a problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file or directory it is about.
    pub path: PathBuf,
    /// What is wrong, naming the field when one.
    pub message: String,
    /// Whether the skill was skipped (else it was loaded as it is).
    pub skipped: bool,
}

/// What the library loads: the kernel's directories, and each config
/// agent's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sources {
    pub kernel: Vec<PathBuf>,
    /// Config agents (and templates) by name, with their directories.
    pub agents: Vec<(String, Vec<PathBuf>)>,
}

impl Sources {
    /// The kernel's directories, and those of each named agent that has any.
    pub fn new<'a>(
        kernel: &[PathBuf],
        agents: impl IntoIterator<Item = (&'a str, &'a [PathBuf])>,
    ) -> Sources {
        Sources {
            kernel: kernel.to_vec(),
            agents: agents
                .into_iter()
                .filter(|(_, dirs)| !dirs.is_empty())
                .map(|(name, dirs)| (name.to_owned(), dirs.to_vec()))
                .collect(),
        }
    }

    /// Whether no directory is named.
    pub fn is_empty(&self) -> bool {
        self.kernel.is_empty() && self.agents.is_empty()
    }

    /// Every directory, each once, kernel's first.
    fn dirs(&self) -> Vec<&Path> {
        let mut dirs: Vec<&Path> = Vec::new();
        let all = self
            .kernel
            .iter()
            .chain(self.agents.iter().flat_map(|(_, d)| d));
        for dir in all {
            if !dirs.contains(&dir.as_path()) {
                dirs.push(dir);
            }
        }
        dirs
    }
}

/// The loaded skills; replaced whole on a reload.
#[derive(Debug, Default)]
pub(crate) struct Library {
    loaded: RwLock<Arc<Loaded>>,
    /// Skills processes saved; a reload leaves them be.
    saved: RwLock<SavedSkills>,
}

/// The skills of one load: [`Loaded::read`], then [`Library::replace`].
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    sources: Sources,
    /// Each directory's skills, by name.
    dirs: HashMap<PathBuf, BTreeMap<String, SkillEntry>>,
    /// The kernel's directories merged: what a process without directories
    /// of its own sees.
    base: Catalogue,
    /// Merged catalogues of processes with directories of their own, by
    /// their directory lists; filled on first use.
    scoped: Mutex<HashMap<Arc<[PathBuf]>, Catalogue>>,
    problems: Vec<Problem>,
}

impl Library {
    /// Loads every directory of `sources` (blocking file reads) and logs
    /// each problem.
    pub(crate) fn load(sources: Sources) -> Library {
        let library = Library::default();
        library.replace(Loaded::read(sources));
        library
    }

    /// Puts `loaded` in place of what was loaded and logs its problems;
    /// answers how many skills it holds and the problems.
    pub(crate) fn replace(&self, loaded: Loaded) -> (usize, Vec<Problem>) {
        for problem in &loaded.problems {
            tracing::warn!(path = %problem.path.display(), skipped = problem.skipped, "skill: {}", problem.message);
        }
        let count = loaded.dirs.values().map(BTreeMap::len).sum();
        let problems = loaded.problems.clone();
        *self.loaded.write() = Arc::new(loaded);
        (count, problems)
    }

    /// Puts the saved skills the store kept in place, skipping with a
    /// warning any that no longer reads as a skill.
    pub(crate) fn restore_saved(&self, stored: &[crate::store::StoredSkill]) {
        let mut saved = self.saved.write();
        for one in stored {
            match SavedSkill::from_stored(one) {
                Ok(skill) => saved.put(skill),
                Err(why) => tracing::warn!(
                    name = %one.name, owner = %one.owner,
                    "saved skill not loaded: {why}"
                ),
            }
        }
    }

    /// The saved skills, to read or change under the lock.
    pub(crate) fn saved(&self) -> &RwLock<SavedSkills> {
        &self.saved
    }

    /// What a process with `dirs` of its own, `pid` on `line` from PID 1,
    /// sees: the config's skills, and the saved skills visible to it whose
    /// names no config skill it sees has.
    pub(crate) fn seen_by(
        &self,
        dirs: Option<&Arc<[PathBuf]>>,
        pid: Pid,
        line: &[Pid],
    ) -> Catalogue {
        let config = self.catalogue(dirs);
        let saved = {
            let saved = self.saved.read();
            if saved.is_empty() {
                return config;
            }
            saved.seen_by(pid, line)
        };
        let mut merged: Vec<SkillEntry> = config.to_vec();
        for entry in saved {
            if config
                .binary_search_by(|e| e.skill.name.as_str().cmp(&entry.skill.name))
                .is_err()
            {
                merged.push(entry);
            }
        }
        merged.sort_by(|a, b| a.skill.name.cmp(&b.skill.name));
        merged.into()
    }

    /// A config skill called `name`, from any directory: the one `skills
    /// show` would give.
    pub(crate) fn config_skill(&self, name: &str) -> Option<SkillEntry> {
        let (listed, _) = self.config_listing();
        listed
            .into_iter()
            .filter(|listed| listed.entry.skill.name == name)
            .find(|listed| !listed.shadowed)
            .map(|listed| listed.entry)
    }

    /// What a process with `dirs` of its own sees of the config's skills.
    pub(crate) fn catalogue(&self, dirs: Option<&Arc<[PathBuf]>>) -> Catalogue {
        let loaded = self.loaded.read().clone();
        let Some(dirs) = dirs.filter(|dirs| !dirs.is_empty()) else {
            return loaded.base.clone();
        };
        if let Some(found) = loaded.scoped.lock().get(dirs) {
            return found.clone();
        }
        let order = loaded.sources.kernel.iter().chain(dirs.iter());
        let merged = loaded.merge(order);
        let mut scoped = loaded.scoped.lock();
        // One entry per distinct directory list a process carries: the
        // config agents' and their descendants' (restored ones included),
        // a handful in practice; cleared by a reload.
        scoped.insert(dirs.clone(), merged.clone());
        merged
    }

    /// Every skill, the config's and the saved ones, by name then by
    /// precedence (saved skills first, the config's winning over them),
    /// with the problems of the last load.
    pub(crate) fn listing(&self) -> (Vec<Listed>, Vec<Problem>) {
        let (config, problems) = self.config_listing();
        let mut listed: Vec<Listed> = Vec::new();
        for saved in self.saved.read().all() {
            listed.push(Listed {
                entry: saved.entry.clone(),
                scope: vec![saved.saved().visibility.to_string()],
                shadowed: config
                    .iter()
                    .any(|c| c.entry.skill.name == saved.entry.skill.name),
            });
        }
        listed.extend(config);
        // Stable: within a name, saved skills stay ahead of the config's.
        listed.sort_by(|a, b| a.entry.skill.name.cmp(&b.entry.skill.name));
        (listed, problems)
    }

    /// Every skill the config's directories hold, by name then by
    /// precedence, with the problems of the last load.
    fn config_listing(&self) -> (Vec<Listed>, Vec<Problem>) {
        let loaded = self.loaded.read().clone();
        let mut listed = Vec::new();
        for dir in loaded.sources.dirs() {
            let Some(skills) = loaded.dirs.get(dir) else {
                continue;
            };
            let mut scope = Vec::new();
            if loaded.sources.kernel.iter().any(|d| d == dir) {
                scope.push("kernel".to_owned());
            }
            for (agent, dirs) in &loaded.sources.agents {
                if dirs.iter().any(|d| d == dir) {
                    scope.push(agent.clone());
                }
            }
            for entry in skills.values() {
                listed.push(Listed {
                    entry: entry.clone(),
                    scope: scope.clone(),
                    shadowed: false,
                });
            }
        }
        // Shadowed: a kernel directory's skill that a later kernel
        // directory or any agent directory also names.
        let kernel = &loaded.sources.kernel;
        let rank = |listed: &Listed| match &listed.entry.source {
            Source::Dir(dir) => kernel
                .iter()
                .position(|d| d.as_path() == &**dir)
                .unwrap_or(kernel.len()),
            Source::Saved(_) => kernel.len(),
        };
        for i in 0..listed.len() {
            let mine = rank(&listed[i]);
            if mine == kernel.len() {
                continue;
            }
            let name = &listed[i].entry.skill.name;
            let beaten = listed
                .iter()
                .any(|other| other.entry.skill.name == *name && rank(other) > mine);
            listed[i].shadowed = beaten;
        }
        listed.sort_by(|a, b| {
            a.entry
                .skill
                .name
                .cmp(&b.entry.skill.name)
                .then(rank(a).cmp(&rank(b)))
        });
        (listed, loaded.problems.clone())
    }
}

impl Loaded {
    /// Reads every directory of `sources` (blocking).
    pub(crate) fn read(sources: Sources) -> Loaded {
        let mut dirs = HashMap::new();
        let mut problems = Vec::new();
        for dir in sources.dirs() {
            dirs.insert(dir.to_path_buf(), read_dir(dir, &mut problems));
        }
        let mut loaded = Loaded {
            dirs,
            problems,
            ..Loaded::default()
        };
        loaded.base = loaded.merge(sources.kernel.iter());
        loaded.sources = sources;
        loaded
    }

    /// The skills of `order`'s directories, a later one's winning, sorted by name.
    fn merge<'a>(&self, order: impl Iterator<Item = &'a PathBuf>) -> Catalogue {
        let mut merged: BTreeMap<&str, &SkillEntry> = BTreeMap::new();
        for dir in order {
            for (name, entry) in self.dirs.get(dir).into_iter().flatten() {
                merged.insert(name, entry);
            }
        }
        merged.into_values().cloned().collect()
    }
}

/// The usable skills directly under `dir`, by name.
fn read_dir(dir: &Path, problems: &mut Vec<Problem>) -> BTreeMap<String, SkillEntry> {
    let mut skills = BTreeMap::new();
    let found = match skill::scan(dir) {
        Ok(found) => found,
        Err(err) => {
            problems.push(Problem {
                path: dir.to_path_buf(),
                message: format!("cannot read the skills directory: {err}"),
                skipped: true,
            });
            return skills;
        }
    };
    let source = Source::Dir(Arc::from(dir));
    for skill_dir in found {
        let read = skill::read(&skill_dir, Strictness::Lenient);
        let skipped = read.skill.is_none();
        for finding in &read.findings {
            problems.push(Problem {
                path: finding.file.clone(),
                message: match &finding.field {
                    Some(field) => format!("{field}: {}", finding.message),
                    None => finding.message.clone(),
                },
                skipped,
            });
        }
        let Some(found) = read.skill else {
            continue;
        };
        if let Some(why) = skill::name_problem(&found.name) {
            problems.push(Problem {
                path: skill_dir.join(skill::SKILL_FILE),
                message: format!("name: {why}; the skill is skipped"),
                skipped: true,
            });
            continue;
        }
        if let Some(first) = skills.get(&found.name) {
            let SkillEntry { skill: first, .. } = first;
            problems.push(Problem {
                path: skill_dir.join(skill::SKILL_FILE),
                message: format!(
                    "name: {:?} is also the name of {}; the skill is skipped",
                    found.name,
                    first.dir.display()
                ),
                skipped: true,
            });
            continue;
        }
        skills.insert(
            found.name.clone(),
            SkillEntry {
                skill: Arc::new(found),
                source: source.clone(),
            },
        );
    }
    skills
}
