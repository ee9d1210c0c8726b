//! The `hivekernel` binary: the allocator, then [`hivekernel_kernel::cli::main`],
//! which parses the command line, runs the command and gives its exit code.

#[global_allocator]
static ALLOCATOR: hivekernel_kernel::Allocator = hivekernel_kernel::Allocator;

fn main() {
    std::process::exit(hivekernel_kernel::cli::main());
}
