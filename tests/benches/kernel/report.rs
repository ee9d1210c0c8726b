//! Rows of figures beside their floors, printed as a table or as JSON.

use serde_json::{Value, json};

/// What a figure counts; decides its formatting and which way is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    /// A duration in nanoseconds; lower is better.
    Nanos,
    /// Operations per second; higher is better.
    PerSec,
    /// A size in bytes; lower is better.
    Bytes,
}

impl Unit {
    fn name(self) -> &'static str {
        match self {
            Unit::Nanos => "ns",
            Unit::PerSec => "per_s",
            Unit::Bytes => "bytes",
        }
    }

    /// `value` for people: 12.3 us, 4.56M/s, 1.23 kB.
    pub(crate) fn show(self, value: f64) -> String {
        let scaled = |value: f64, steps: &[(f64, &str)]| {
            let (div, suffix) = steps
                .iter()
                .rev()
                .find(|(div, _)| value >= *div)
                .unwrap_or(&steps[0]);
            let x = value / div;
            let digits = if x >= 100.0 {
                0
            } else if x >= 10.0 {
                1
            } else {
                2
            };
            format!("{x:.digits$}{suffix}")
        };
        match self {
            Unit::Nanos => scaled(
                value,
                &[(1.0, " ns"), (1e3, " us"), (1e6, " ms"), (1e9, " s")],
            ),
            Unit::PerSec => scaled(value, &[(1.0, "/s"), (1e3, "k/s"), (1e6, "M/s")]),
            Unit::Bytes => scaled(value, &[(1.0, " B"), (1e3, " kB"), (1e6, " MB")]),
        }
    }
}

/// A goal from the issue, and how a figure is held against it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// As printed, e.g. "<= 2x floor".
    pub(crate) text: String,
    check: Check,
}

#[derive(Debug, Clone, Copy)]
enum Check {
    /// The cost ratio may be at most this.
    MaxRatio(f64),
    /// The figure may be at most this, in the row's unit.
    AtMost(f64),
    /// The figure must be at least this, in the row's unit.
    AtLeast(f64),
}

impl Target {
    /// The cost ratio (see [`Row::ratio`]) may be at most `max`.
    pub(crate) fn ratio(max: f64, text: impl Into<String>) -> Target {
        Target {
            text: text.into(),
            check: Check::MaxRatio(max),
        }
    }

    /// The figure may be at most `max`.
    pub(crate) fn at_most(max: f64, unit: Unit) -> Target {
        Target {
            text: format!("<= {}", unit.show(max)),
            check: Check::AtMost(max),
        }
    }

    /// The figure must be at least `min`.
    pub(crate) fn at_least(min: f64, unit: Unit) -> Target {
        Target {
            text: format!(">= {}", unit.show(min)),
            check: Check::AtLeast(min),
        }
    }
}

/// One figure, its floor from the same run, and its target.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// The `--only` group that produced it.
    pub(crate) group: &'static str,
    pub(crate) label: String,
    pub(crate) unit: Unit,
    /// `None` when the measurement is not available.
    pub(crate) ours: Option<f64>,
    pub(crate) floor: Option<f64>,
    pub(crate) target: Option<Target>,
    /// Counts and caveats worth reading beside the figure.
    pub(crate) note: String,
}

impl Row {
    /// A row for a figure measured next to its floor.
    pub(crate) fn new(
        group: &'static str,
        label: impl Into<String>,
        unit: Unit,
        ours: f64,
        floor: Option<f64>,
    ) -> Row {
        Row {
            group,
            label: label.into(),
            unit,
            ours: Some(ours),
            floor,
            target: None,
            note: String::new(),
        }
    }

    pub(crate) fn target(mut self, target: Target) -> Row {
        self.target = Some(target);
        self
    }

    pub(crate) fn note(mut self, note: impl Into<String>) -> Row {
        self.note = note.into();
        self
    }

    /// How many times costlier than the floor: ours/floor for times and
    /// sizes, floor/ours for rates. 1.0 is the floor itself.
    pub(crate) fn ratio(&self) -> Option<f64> {
        let (ours, floor) = (self.ours?, self.floor?);
        let ratio = match self.unit {
            Unit::PerSec => floor / ours,
            Unit::Nanos | Unit::Bytes => ours / floor,
        };
        ratio.is_finite().then_some(ratio)
    }

    /// PASS, MISS, n/a without a figure, or `None` without a target.
    pub(crate) fn status(&self) -> Option<&'static str> {
        let target = self.target.as_ref()?;
        let Some(ours) = self.ours else {
            return Some("n/a");
        };
        let pass = match target.check {
            Check::MaxRatio(max) => self.ratio()? <= max,
            Check::AtMost(max) => ours <= max,
            Check::AtLeast(min) => ours >= min,
        };
        Some(if pass { "PASS" } else { "MISS" })
    }
}

/// The machine the figures come from.
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    pub(crate) nproc: usize,
    pub(crate) cpu: String,
    pub(crate) kernel: String,
    pub(crate) rustc: String,
    pub(crate) date: String,
    /// Load averages when the run began: anything else running skews every figure.
    pub(crate) load: String,
}

impl Machine {
    pub(crate) fn detect() -> Machine {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|line| line.starts_with("model name"))
                    .and_then(|line| line.split_once(':'))
                    .map(|(_, model)| model.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into());
        Machine {
            nproc: std::thread::available_parallelism().map_or(0, usize::from),
            cpu,
            kernel: format!("Linux {kernel}"),
            rustc: command_line("rustc", &["--version"]),
            date: command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            load: std::fs::read_to_string("/proc/loadavg")
                .map(|avg| avg.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
                .unwrap_or_else(|_| "unknown".into()),
        }
    }
}

/// The first line `program args` prints, or "unknown".
fn command_line(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Everything one run produced.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) mode: &'static str,
    pub(crate) machine: Machine,
    pub(crate) rows: Vec<Row>,
    /// What each group's floor is, by group.
    pub(crate) floors: Vec<(&'static str, &'static str)>,
}

const RATIO_HEADER: &str = "x floor (t: ours/floor, rate: floor/ours)";

impl Report {
    /// The table, with a legend of floors under it.
    pub(crate) fn table(&self) -> String {
        let m = &self.machine;
        let mut out = format!(
            "HiveKernel kernel bench ({} mode): {} cores, {}, {}, {}, {}, load average {} at start\n\n",
            self.mode, m.nproc, m.cpu, m.kernel, m.rustc, m.date, m.load
        );
        let header = [
            "measurement",
            "ours",
            "floor",
            RATIO_HEADER,
            "target",
            "status",
            "notes",
        ];
        let cells: Vec<[String; 7]> = self
            .rows
            .iter()
            .map(|row| {
                [
                    row.label.clone(),
                    row.ours.map_or("n/a".into(), |v| row.unit.show(v)),
                    row.floor.map_or("-".into(), |v| row.unit.show(v)),
                    row.ratio().map_or("-".into(), |r| format!("{r:.2}")),
                    row.target.as_ref().map_or("-".into(), |t| t.text.clone()),
                    row.status().unwrap_or("-").to_owned(),
                    row.note.clone(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &cells {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let line = |cells: &[&str]| {
            let mut text = String::new();
            for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
                // Names and notes read left to right; figures line up on the right.
                let pad = width.saturating_sub(cell.chars().count());
                match i {
                    0 | 4..=6 => text.push_str(&format!("{cell}{}", " ".repeat(pad))),
                    _ => text.push_str(&format!("{}{cell}", " ".repeat(pad))),
                }
                text.push_str("  ");
            }
            text.trim_end().to_owned() + "\n"
        };
        out.push_str(&line(&header));
        out.push_str(&line(
            &widths.map(|w| "-".repeat(w)).each_ref().map(String::as_str),
        ));
        let mut group = None;
        for (row, cells) in self.rows.iter().zip(&cells) {
            if group.is_some_and(|g| g != row.group) {
                out.push('\n');
            }
            group = Some(row.group);
            out.push_str(&line(&cells.each_ref().map(String::as_str)));
        }
        out.push_str(
            "\nFloors (measured in this run, same runtime: tokio multi-thread, 2 workers):\n",
        );
        for (group, floor) in &self.floors {
            out.push_str(&format!("  {group:<11} {floor}\n"));
        }
        out
    }

    /// The whole report as one JSON document.
    pub(crate) fn json(&self) -> Value {
        let m = &self.machine;
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|row| {
                json!({
                    "group": row.group,
                    "label": row.label,
                    "unit": row.unit.name(),
                    "ours": row.ours,
                    "floor": row.floor,
                    "ratio": row.ratio(),
                    "target": row.target.as_ref().map(|t| t.text.as_str()),
                    "status": row.status(),
                    "note": row.note,
                })
            })
            .collect();
        let floors: serde_json::Map<String, Value> = self
            .floors
            .iter()
            .map(|(group, floor)| ((*group).to_owned(), Value::from(*floor)))
            .collect();
        json!({
            "mode": self.mode,
            "ratio": "cost relative to the floor: ours/floor for times and sizes, floor/ours for rates",
            "machine": {
                "nproc": m.nproc,
                "cpu": m.cpu,
                "kernel": m.kernel,
                "rustc": m.rustc,
                "date": m.date,
                "load_average": m.load,
            },
            "floors": floors,
            "rows": rows,
        })
    }
}
