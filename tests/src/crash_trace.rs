//! `STRATA_CRASH_TRACE=1`: a test process that receives SIGSEGV, SIGBUS or SIGABRT prints
//! the faulting thread's id, name and stack (glibc's `backtrace`, module and offset per frame,
//! for `addr2line` against the unstripped binary) to stderr before it dies as it would have.
//! For crashes no test reports (one at process exit, after every test passed). The handler
//! only makes system calls and glibc's async-signal-safe `backtrace_symbols_fd` (`backtrace`
//! is called once when it is installed, so its library is already loaded), and runs on the
//! thread's alternate signal stack where Rust made one.

use std::sync::Once;

static INSTALL: Once = Once::new();

/// Installs the handler once, when `STRATA_CRASH_TRACE=1`.
///
/// ```
/// strata_tests::crash_trace::install(); // a no-op unless STRATA_CRASH_TRACE=1
/// ```
pub fn install() {
    if !std::env::var("STRATA_CRASH_TRACE").is_ok_and(|v| v == "1") {
        return;
    }
    INSTALL.call_once(|| {
        let mut frames = [std::ptr::null_mut::<libc::c_void>(); 4];
        // SAFETY: fills a local array (loads the unwinder now, not in the handler); then
        // registers a handler for the crash signals with a zeroed, then filled, sigaction.
        unsafe {
            libc::backtrace(frames.as_mut_ptr(), frames.len() as libc::c_int);
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_crash as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_ONSTACK | libc::SA_RESETHAND;
            libc::sigemptyset(&mut action.sa_mask);
            for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT] {
                libc::sigaction(sig, &action, std::ptr::null_mut());
            }
        }
    });
}

/// Writes `bytes` to stderr.
fn say(bytes: &[u8]) {
    // SAFETY: write(2) from a valid slice.
    unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

/// `v` in decimal into `buf`, returning the digits.
fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

extern "C" fn on_crash(sig: libc::c_int) {
    let mut frames = [std::ptr::null_mut::<libc::c_void>(); 64];
    let mut digits = [0u8; 20];
    let mut name = [0u8; 17];
    // SAFETY: system calls on local buffers; the handler was reset to the default action
    // (SA_RESETHAND), so the re-raised signal ends the process as it would have.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as u64;
        libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr());
        say(b"crash trace: signal ");
        say(decimal(sig as u64, &mut digits));
        say(b" in thread ");
        say(decimal(tid, &mut digits));
        say(b" (");
        say(&name[..name.iter().position(|&b| b == 0).unwrap_or(16)]);
        say(b")\n");
        let n = libc::backtrace(frames.as_mut_ptr(), frames.len() as libc::c_int);
        libc::backtrace_symbols_fd(frames.as_ptr(), n, 2);
        libc::raise(sig);
    }
}
