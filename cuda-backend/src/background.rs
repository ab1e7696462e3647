//! The compiler's background thread: compiles left to it run there one at a time, in the
//! order given (`Compiler::compile_later`). At process exit the thread stops before NVRTC
//! and the driver unload: an exit handler lets the compile under way finish (a process that
//! exited during one crashed in the driver's teardown) and drops the ones still queued, which
//! the next process compiles again if it needs them.

use crate::compile::Compiler;
use crate::render::Optimization;
use cudarc::driver::sys;
use std::sync::{mpsc, Condvar, Mutex, Once, OnceLock};
use std::time::Duration;
use strata_core::sync::LockUnpoisoned;
use strata_core::Result;

/// A compile left to the background thread: the kernel `name` of `body` at `optimization`,
/// and what to do with the loaded function (or the error).
pub(crate) struct Job {
    pub body: String,
    pub name: String,
    pub optimization: Optimization,
    pub then: Box<dyn FnOnce(Result<sys::CUfunction>) + Send>,
}

/// One compiler's background thread, started with its first job.
#[derive(Default)]
pub(crate) struct Background {
    /// The thread's queue (`None` inside: the thread could not start).
    queue: OnceLock<Option<mpsc::Sender<Job>>>,
}

impl Background {
    /// Queues `job`, starting the thread with `worker` (the compiler it compiles with) when it
    /// is not running; false, with the job dropped, when the thread cannot start.
    pub(crate) fn submit(&self, worker: impl FnOnce() -> Compiler, job: Job) -> bool {
        let queue = self.queue.get_or_init(|| {
            let worker = worker();
            let (send, receive) = mpsc::channel::<Job>();
            WAIT_AT_EXIT.call_once(|| {
                // SAFETY: registers a plain `extern "C"` function with the C library.
                unsafe { atexit(wait_for_compiles) };
            });
            std::thread::Builder::new()
                .name("strata-nvrtc".into())
                .spawn(move || {
                    for job in receive {
                        if !STATE.start() {
                            // Exiting: unloading the worker's modules now would race the
                            // driver's own teardown.
                            std::mem::forget(worker);
                            return;
                        }
                        let f = worker.load_function(&job.body, &job.name, job.optimization);
                        (job.then)(f);
                        STATE.end();
                    }
                })
                .ok()
                .map(|_| send)
        });
        queue.as_ref().is_some_and(|q| q.send(job).is_ok())
    }
}

/// Every background thread's compiles under way, and whether the process is exiting.
struct State {
    /// (exiting, compiles running)
    inner: Mutex<(bool, usize)>,
    ended: Condvar,
}

impl State {
    /// Marks a compile as running; false when the process is exiting (the thread stops).
    fn start(&self) -> bool {
        let mut s = self.inner.lock_unpoisoned();
        if s.0 {
            return false;
        }
        s.1 += 1;
        true
    }

    fn end(&self) {
        self.inner.lock_unpoisoned().1 -= 1;
        self.ended.notify_all();
    }
}

static STATE: State = State {
    inner: Mutex::new((false, 0)),
    ended: Condvar::new(),
};

static WAIT_AT_EXIT: Once = Once::new();

extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

/// At exit: no compile starts any more; the ones running get up to ten seconds to finish.
extern "C" fn wait_for_compiles() {
    let mut s = STATE.inner.lock_unpoisoned();
    s.0 = true;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.1 > 0 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        s = STATE
            .ended
            .wait_timeout(s, left)
            .map_or_else(|e| e.into_inner().0, |(s, _)| s);
    }
}
