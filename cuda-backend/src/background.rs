//! The compiler's background thread: jobs left to it (`Compiler::compile_later`'s compiles)
//! run there one at a time, in the order given, with the thread's own state (its compiler,
//! made when the thread starts). At process exit the thread stops before NVRTC
//! and the driver unload: an exit handler lets the compile under way finish (a process that
//! exited during one crashed in the driver's teardown) and drops the ones still queued, which
//! the next process compiles again if it needs them. Exit handlers run last registered first,
//! and NVRTC registers the teardown of state it sets up lazily during a compile, so the
//! handler is registered again after every job (an exit during a job's compile otherwise
//! tore NVRTC down under it: SIGSEGV in its front end, H200, one process in three).

use std::sync::{mpsc, Condvar, Mutex, Once, OnceLock};
use std::time::Duration;
use strata_core::sync::LockUnpoisoned;

/// The background thread's stack: a main thread's 8 MiB, twice over (pages are only
/// committed when touched).
const NVRTC_STACK: usize = 16 << 20;

/// A job for the background thread, given the thread's state.
pub(crate) type Job<W> = Box<dyn FnOnce(&W) + Send>;

/// A background thread whose state is a `W`, started with its first job.
pub(crate) struct Background<W> {
    /// The thread's queue (`None` inside: the thread could not start).
    queue: OnceLock<Option<mpsc::Sender<Job<W>>>>,
}

impl<W> Default for Background<W> {
    fn default() -> Self {
        Background {
            queue: OnceLock::new(),
        }
    }
}

impl<W> Background<W> {
    /// True once the thread has been started (or failed to start).
    pub(crate) fn started(&self) -> bool {
        self.queue.get().is_some()
    }
}

impl<W: Send + 'static> Background<W> {
    /// Queues `job`, starting the thread with the state `worker` makes when it is not
    /// running; false, with the job dropped, when the thread cannot start.
    pub(crate) fn submit(&self, worker: impl FnOnce() -> W, job: Job<W>) -> bool {
        let queue = self.queue.get_or_init(|| {
            let worker = worker();
            let (send, receive) = mpsc::channel::<Job<W>>();
            WAIT_AT_EXIT.call_once(register_exit_wait);
            std::thread::Builder::new()
                .name("strata-nvrtc".into())
                // NVRTC's optimizing compile outgrew a spawned thread's default 2 MiB stack
                // (SIGSEGV in its front end's setjmp, H200, about one process in three).
                .stack_size(NVRTC_STACK)
                .spawn(move || {
                    for job in receive {
                        if !STATE.start() {
                            // Exiting: dropping the state now (a compiler unloads its
                            // modules) would race the driver's own teardown.
                            std::mem::forget(worker);
                            return;
                        }
                        job(&worker);
                        STATE.end();
                        // The job may have set up state (NVRTC's, lazily) whose teardown it
                        // registered at exit: registered again now, the wait runs before it.
                        register_exit_wait();
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

/// Registers [`wait_for_compiles`] to run at exit, before every exit handler registered
/// earlier (the C library runs them last registered first).
fn register_exit_wait() {
    // SAFETY: registers a plain `extern "C"` function with the C library.
    unsafe { atexit(wait_for_compiles) };
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
