//! The CPU engine every fuzz target runs its inputs through (included by each target with
//! `#[path]`): one per process, of one thread.

use std::sync::OnceLock;

use tensorzip::CpuEngine;

pub fn engine() -> &'static CpuEngine {
    static E: OnceLock<CpuEngine> = OnceLock::new();
    E.get_or_init(|| CpuEngine::new(1).expect("one thread"))
}
