//! The `capture` runtime factory: hands a test the real `ProcessContext` the
//! kernel gives a process, so tools can be called as that process.

use std::sync::Arc;

use hivekernel_agents::echo::EchoFactory;
use hivekernel_agents::{ProcessContext, Runtime, RuntimeError, RuntimeFactory};
use parking_lot::Mutex;

/// Keeps the context of the last process it created a runtime for, and runs
/// that process with an inner factory (`echo` by default).
#[derive(Debug)]
pub struct Capture {
    context: Mutex<Option<ProcessContext>>,
    inner: Arc<dyn RuntimeFactory>,
}

impl Default for Capture {
    fn default() -> Self {
        Capture::wrapping(Arc::new(EchoFactory::default()))
    }
}

impl Capture {
    /// A capture whose processes run the runtime `inner` creates.
    pub fn wrapping(inner: Arc<dyn RuntimeFactory>) -> Self {
        Capture {
            context: Mutex::new(None),
            inner,
        }
    }

    /// The context captured last, if not taken yet.
    pub fn take(&self) -> Option<ProcessContext> {
        self.context.lock().take()
    }
}

impl RuntimeFactory for Capture {
    fn create(&self, ctx: &ProcessContext) -> Result<Arc<dyn Runtime>, RuntimeError> {
        *self.context.lock() = Some(ctx.clone());
        self.inner.create(ctx)
    }
}

/// A kernel with [`crate::test_settings`] and one `echo`-driven process named
/// `name` under PID 1, whose real context is returned so tools can be
/// called as that process.
pub async fn captured_process(name: &str) -> (hivekernel_kernel::Kernel, ProcessContext) {
    captured_process_with(name, crate::test_settings()).await
}

/// [`captured_process`] in a kernel with `settings`.
pub async fn captured_process_with(
    name: &str,
    settings: hivekernel_kernel::config::KernelSettings,
) -> (hivekernel_kernel::Kernel, ProcessContext) {
    use hivekernel_agents::{Pid, SpawnRequest};
    use hivekernel_kernel::{Caller, Kernel};
    let capture = Arc::new(Capture::default());
    let (mut runtimes, _) = crate::registry();
    runtimes.register("capture", capture.clone());
    let kernel = crate::start(Kernel::builder(settings).runtimes(runtimes)).await;
    let mut request = SpawnRequest::new(Pid::KERNEL, name);
    request.runtime = Some("capture".into());
    kernel
        .spawn(Caller::Admin, request)
        .await
        .unwrap_or_else(|err| panic!("spawn {name}: {err}"));
    let process = capture
        .take()
        .unwrap_or_else(|| panic!("no context captured for {name}"));
    (kernel, process)
}
