//! Cron's public vocabulary: entries as declared and as they ran, the
//! policies, the limits, and when an expression fires next. The schedules
//! are kept and run by the kernel (kernel/cron.rs).

pub use crate::kernel::cron::{
    CRON_MESSAGE, CronAction, CronHandle, CronInfo, CronRun, CronSource, CronSpec, HISTORY,
    MAX_CRON_NAME_BYTES, MAX_CRON_PER_PROCESS, Missed, OUTPUT_PREVIEW, Overlap, next_fire,
};
